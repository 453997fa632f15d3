//! `GET /v1/runs/{id}/events`: a run's live events as Server-Sent Events. Each event has an
//! id (its 1-based place in the run's events); a client that reconnects with `Last-Event-ID`
//! gets the events after it. A run that has ended answers its `report` at once (its live
//! events are gone with it); one held by another server sharing the history answers its
//! report when that ends. The stream holds only the run's feed: a client that goes away
//! drops it, and the run goes on as before.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};

use super::{query, run_id, V1Error};
use crate::api::Api;
use crate::live::{Event, Feed};
use crate::report::{RunReport, Status};
use crate::runs::metrics::LiveReader;
use crate::runs::RunManager;

/// How often a comment keeps a quiet stream open through proxies.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn sse(id: String, event: &Event) -> SseEvent {
    SseEvent::default()
        .id(id)
        .event(event.name())
        .data(event.data().to_string())
}

/// The events of a feed after `seen`, as they come, to the report.
fn follow(
    feed: Arc<Feed>,
    seen: u64,
    reader: LiveReader,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let changes = feed.subscribe();
    stream::unfold(
        (feed, changes, seen, false, reader),
        |(feed, mut changes, seen, done, reader)| async move {
            if done {
                return None;
            }
            loop {
                changes.borrow_and_update();
                let (events, ended) = feed.after(seen);
                if !events.is_empty() {
                    let last = events.last().map(|(i, _)| *i).unwrap_or(seen);
                    let batch: Vec<_> = events
                        .iter()
                        .map(|(i, e)| Ok(sse(i.to_string(), e)))
                        .collect();
                    return Some((stream::iter(batch), (feed, changes, last, ended, reader)));
                }
                if ended || changes.changed().await.is_err() {
                    return None;
                }
            }
        },
    )
    .flatten()
}

/// How often a run waiting in the shared queue is looked at again, in case this server claims
/// it (its feed then appears here and is followed live).
const CLAIM_CHECK: Duration = Duration::from_secs(1);

/// A run not held here: its live feed if this server claims it while it waits in the shared
/// queue, or else its report once it is final.
fn report_when_ended(
    manager: RunManager,
    id: String,
    first: RunReport,
    seen: u64,
    reader: LiveReader,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    stream::once(async move {
        let mut last = first;
        loop {
            if !last.status.is_terminal() {
                if let Some(feed) = manager.feed(&id) {
                    return follow(feed, seen, reader).boxed();
                }
            }
            if last.status.is_terminal() || last.status != Status::Queued {
                break;
            }
            last = match manager.wait(&id, CLAIM_CHECK).await {
                Ok(r) => r,
                Err(_) => break,
            };
        }
        let _reader = reader;
        let report = if last.status.is_terminal() {
            last
        } else {
            manager.wait_end(&id).await.unwrap_or(last)
        };
        stream::iter([Ok(sse("report".into(), &Event::Report(Arc::new(report))))]).boxed()
    })
    .flatten()
}

pub(super) async fn run_events(
    State(api): State<Api>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, V1Error> {
    let id = run_id(path)?;
    query(raw.as_deref(), &[])?;
    let seen = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => 0,
        Some(Ok(v)) => v.trim().parse::<u64>().unwrap_or(0),
        Some(Err(_)) => 0,
    };
    let m = api.manager().clone();
    let reader = m.live_reader();
    let keep = KeepAlive::new().interval(KEEP_ALIVE);
    if let Some(feed) = m.feed(&id) {
        return Ok(Sse::new(follow(feed, seen, reader).boxed())
            .keep_alive(keep)
            .into_response());
    }
    let first = m.wait(&id, Duration::ZERO).await?;
    Ok(
        Sse::new(report_when_ended(m, id, first, seen, reader).boxed())
            .keep_alive(keep)
            .into_response(),
    )
}
