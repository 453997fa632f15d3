//! A run's live events, as they happen: `queued`, `started {stage}`, `stdout`/`stderr`
//! `{data}`, `truncated {stream}`, `file {path, size_bytes}` and one final `report`. The run
//! manager makes a [`Feed`] when it accepts a run and ends it with the report; the executor
//! is handed the feed and writes into it as the stages go; `GET /v1/runs/{id}/events`, MCP
//! progress and Piston's WebSocket read it.
//!
//! Bounded: output is what the stages keep anyway (the output caps), and the feed keeps at
//! most `max_bytes` of it in all (a `truncated` event says where it stopped). A reader holds
//! only an `Arc` of the feed and a watch receiver: one that goes away costs nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::report::{RunReport, Stage};

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One event of a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Queued,
    Started {
        stage: Stage,
    },
    Output {
        stream: Stream,
        data: String,
        /// The test case that wrote it (1-based), when several run at once.
        case: Option<u32>,
    },
    /// A cap was reached: output of `stream` past this point is not shown.
    Truncated {
        stream: Stream,
        reason: String,
    },
    File {
        path: String,
        size_bytes: u64,
    },
    Report(Arc<RunReport>),
}

impl Event {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Queued => "queued",
            Event::Started { .. } => "started",
            Event::Output { stream, .. } => stream.as_str(),
            Event::Truncated { .. } => "truncated",
            Event::File { .. } => "file",
            Event::Report(_) => "report",
        }
    }

    /// The event's data, as JSON.
    pub fn data(&self) -> serde_json::Value {
        match self {
            Event::Queued => json!({}),
            Event::Started { stage } => json!({ "stage": stage.as_str() }),
            Event::Output {
                data, case: None, ..
            } => json!({ "data": data }),
            Event::Output {
                data,
                case: Some(case),
                ..
            } => json!({ "data": data, "case": case }),
            Event::Truncated { stream, reason } => {
                json!({ "stream": stream.as_str(), "reason": reason })
            }
            Event::File { path, size_bytes } => json!({ "path": path, "size_bytes": size_bytes }),
            Event::Report(r) => serde_json::to_value(&**r).unwrap_or_default(),
        }
    }
}

/// Bytes of the newest output kept for progress messages.
const TAIL_BYTES: usize = 4096;
/// Events a feed keeps at most: a program that writes a byte at a time still costs a bounded
/// list, and a late reader clones at most this many.
const MAX_EVENTS: usize = 4096;

struct State {
    events: Vec<Event>,
    /// Output bytes kept in `events`.
    bytes: u64,
    /// A stream whose output no longer enters the feed.
    capped: [bool; 2],
    /// The newest output, both streams, for [`Feed::tail`].
    tail: VecDeque<u8>,
    ended: bool,
}

/// The live events of one run. Event ids are 1-based positions.
pub struct Feed {
    state: Mutex<State>,
    /// The number of events so far; readers wait on it.
    count: watch::Sender<u64>,
    max_bytes: u64,
    /// The program's stdin while it runs (Piston's WebSocket): the run stage forwards it.
    stdin: Option<Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>>,
}

/// How many bytes of `bytes` end in an incomplete UTF-8 character.
fn incomplete_tail(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => 0,
        Err(e) if e.error_len().is_none() => bytes.len() - e.valid_up_to(),
        Err(_) => {
            // Invalid bytes earlier; only a possible start of a character at the very end
            // is held back (at most 3 bytes).
            let n = bytes.len();
            (1..=3.min(n))
                .find(|&k| {
                    let b = bytes[n - k];
                    b >= 0xC0
                        && std::str::from_utf8(&bytes[n - k..])
                            .is_err_and(|e| e.error_len().is_none())
                })
                .unwrap_or(0)
        }
    }
}

impl Feed {
    /// A feed that keeps at most `max_bytes` of output; its first event is `queued`.
    pub fn new(max_bytes: u64) -> Arc<Feed> {
        Feed::build(max_bytes, None)
    }

    /// A feed whose run stage reads its program's stdin from `stdin` (until it closes).
    pub(super) fn with_stdin(max_bytes: u64, stdin: mpsc::Receiver<Bytes>) -> Arc<Feed> {
        Feed::build(max_bytes, Some(Arc::new(tokio::sync::Mutex::new(stdin))))
    }

    fn build(
        max_bytes: u64,
        stdin: Option<Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>>,
    ) -> Arc<Feed> {
        let (count, _) = watch::channel(1);
        Arc::new(Feed {
            state: Mutex::new(State {
                events: vec![Event::Queued],
                bytes: 0,
                capped: [false; 2],
                tail: VecDeque::new(),
                ended: false,
            }),
            count,
            max_bytes,
            stdin,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, st: &mut State, event: Event) {
        if st.ended {
            return;
        }
        if let Event::Report(_) = event {
            st.ended = true;
        }
        st.events.push(event);
        self.count.send_replace(st.events.len() as u64);
    }

    /// The program's stdin, when it is given while it runs.
    pub fn stdin(&self) -> Option<Arc<tokio::sync::Mutex<mpsc::Receiver<Bytes>>>> {
        self.stdin.clone()
    }

    /// A stage began.
    pub fn started(&self, stage: Stage) {
        self.push(&mut self.lock(), Event::Started { stage });
    }

    /// A writer of this feed's output: a stage, or one test case of several (`case`, 1-based).
    pub(super) fn pen(self: &Arc<Feed>, case: Option<u32>) -> Pen {
        Pen {
            feed: self.clone(),
            case,
            partial: [Vec::new(), Vec::new()],
        }
    }

    /// The run ended: its report is the last event.
    pub fn finish(&self, report: Arc<RunReport>) {
        self.push(&mut self.lock(), Event::Report(report));
    }

    /// The run left this server without a report (a claim given back to the shared queue):
    /// readers stop here and look for the report where the run goes on.
    pub(super) fn abandon(&self) {
        let mut st = self.lock();
        st.ended = true;
        self.count.send_replace(st.events.len() as u64);
    }

    /// The events after the first `seen`, with their ids; and whether the feed has ended
    /// (with the report among them, or `Feed::abandon`ed): nothing follows.
    pub fn after(&self, seen: u64) -> (Vec<(u64, Event)>, bool) {
        let st = self.lock();
        let from = (seen as usize).min(st.events.len());
        let events = st.events[from..]
            .iter()
            .enumerate()
            .map(|(i, e)| ((from + i + 1) as u64, e.clone()))
            .collect();
        (events, st.ended)
    }

    /// Wakes when events are added.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.count.subscribe()
    }

    /// The newest output: at most `lines` lines and `bytes` bytes of it (whole characters).
    pub fn tail(&self, lines: usize, bytes: usize) -> String {
        let st = self.lock();
        let raw: Vec<u8> = st.tail.iter().copied().collect();
        drop(st);
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches('\n');
        let mut start = 0;
        for (n, (i, _)) in text.rmatch_indices('\n').enumerate() {
            if n + 1 >= lines {
                start = i + 1;
                break;
            }
        }
        let mut out = &text[start..];
        while out.len() > bytes {
            let cut = out.len() - bytes;
            let at = (cut..out.len())
                .find(|&i| out.is_char_boundary(i))
                .unwrap_or(out.len());
            out = &out[at..];
        }
        out.to_string()
    }
}

/// One writer of a feed: it holds back the end of its own output that is not yet a whole UTF-8
/// character, so writers running at once (test cases) never split each other's characters.
/// What it holds goes out when it is dropped.
pub(super) struct Pen {
    feed: Arc<Feed>,
    case: Option<u32>,
    partial: [Vec<u8>; 2],
}

impl Pen {
    /// Output of the program (or compiler), as it came.
    pub fn output(&mut self, stream: Stream, bytes: &[u8]) {
        let feed = self.feed.clone();
        let mut st = feed.lock();
        let i = stream.index();
        if st.capped[i] || bytes.is_empty() {
            return;
        }
        if st.events.len() >= MAX_EVENTS - 2 {
            // Room is left for this notice and the report.
            self.flush(&feed, &mut st);
            st.capped = [true; 2];
            let reason = format!("the live output keeps at most {MAX_EVENTS} events");
            feed.push(&mut st, Event::Truncated { stream, reason });
            return;
        }
        let room = feed.max_bytes.saturating_sub(st.bytes) as usize;
        let keep = bytes.len().min(room);
        self.partial[i].extend_from_slice(&bytes[..keep]);
        st.bytes += keep as u64;
        let tail = &mut st.tail;
        tail.extend(&bytes[..keep]);
        while tail.len() > TAIL_BYTES {
            tail.pop_front();
        }
        let held = incomplete_tail(&self.partial[i]);
        let whole = self.partial[i].len() - held;
        if whole > 0 {
            let rest = self.partial[i].split_off(whole);
            let done = std::mem::replace(&mut self.partial[i], rest);
            let data = String::from_utf8_lossy(&done).into_owned();
            feed.push(&mut st, self.event(stream, data));
        }
        if keep < bytes.len() {
            self.flush(&feed, &mut st);
            st.capped[i] = true;
            let reason = format!("the live output keeps at most {} bytes", feed.max_bytes);
            feed.push(&mut st, Event::Truncated { stream, reason });
        }
    }

    /// The stage's output cap was reached on `stream`.
    pub fn truncated(&mut self, stream: Stream, limit: u64) {
        let feed = self.feed.clone();
        let mut st = feed.lock();
        self.flush(&feed, &mut st);
        let reason = format!("the output cap of {limit} bytes per stream was reached");
        feed.push(&mut st, Event::Truncated { stream, reason });
    }

    /// A file the program left under `outputs/`.
    pub fn file(&self, path: &str, size_bytes: u64) {
        let file = Event::File {
            path: path.to_string(),
            size_bytes,
        };
        self.feed.push(&mut self.feed.lock(), file);
    }

    fn event(&self, stream: Stream, data: String) -> Event {
        Event::Output {
            stream,
            data,
            case: self.case,
        }
    }

    /// What is held of an incomplete character goes out as it is (replaced).
    fn flush(&mut self, feed: &Feed, st: &mut State) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let held = std::mem::take(&mut self.partial[stream.index()]);
            if !held.is_empty() {
                let data = String::from_utf8_lossy(&held).into_owned();
                feed.push(st, self.event(stream, data));
            }
        }
    }
}

impl Drop for Pen {
    fn drop(&mut self) {
        let feed = self.feed.clone();
        let mut st = feed.lock();
        self.flush(&feed, &mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> RunReport {
        RunReport::new(
            "r",
            "python",
            crate::report::Status::Succeeded,
            crate::report::RunLimits {
                memory_mb: 512,
                timeout_seconds: 30.0,
                cpus: 1.0,
            },
            "",
        )
    }

    fn texts(feed: &Feed) -> Vec<String> {
        feed.after(0)
            .0
            .into_iter()
            .map(|(_, e)| format!("{} {}", e.name(), e.data()))
            .collect()
    }

    #[test]
    fn a_character_split_between_frames_arrives_whole() {
        let feed = Feed::new(1024);
        let snow = "é".as_bytes();
        let mut pen = feed.pen(None);
        pen.output(Stream::Stdout, &[b'a', snow[0]]);
        pen.output(Stream::Stdout, &[snow[1], b'b']);
        assert_eq!(
            texts(&feed),
            vec![
                "queued {}".to_string(),
                r#"stdout {"data":"a"}"#.to_string(),
                r#"stdout {"data":"éb"}"#.to_string(),
            ]
        );
    }

    #[test]
    fn cases_running_at_once_never_split_each_others_characters() {
        let feed = Feed::new(1024);
        let snow = "é".as_bytes();
        let (mut one, mut two) = (feed.pen(Some(1)), feed.pen(Some(2)));
        one.output(Stream::Stdout, &[snow[0]]);
        two.output(Stream::Stdout, b"x");
        one.output(Stream::Stdout, &[snow[1]]);
        let t = texts(&feed);
        assert!(!t.iter().any(|e| e.contains('\u{FFFD}')), "{t:?}");
        assert_eq!(
            t[1..],
            [
                r#"stdout {"case":2,"data":"x"}"#.to_string(),
                r#"stdout {"case":1,"data":"é"}"#.to_string(),
            ]
        );
    }

    #[test]
    fn the_feed_keeps_a_bounded_number_of_events_however_small_the_writes() {
        let feed = Feed::new(1 << 30);
        let mut pen = feed.pen(None);
        for _ in 0..(MAX_EVENTS * 2) {
            pen.output(Stream::Stdout, b"x");
        }
        feed.finish(Arc::new(report()));
        let (events, ended) = feed.after(0);
        assert!(ended, "the report still comes");
        assert!(events.len() <= MAX_EVENTS, "{} events", events.len());
        assert_eq!(events[events.len() - 2].1.name(), "truncated");
    }

    #[test]
    fn the_feed_stops_at_its_cap_with_a_truncated_event() {
        let feed = Feed::new(4);
        let mut pen = feed.pen(None);
        pen.output(Stream::Stdout, b"abcdef");
        pen.output(Stream::Stdout, b"more");
        let t = texts(&feed);
        assert_eq!(t[1], r#"stdout {"data":"abcd"}"#);
        assert!(t[2].starts_with("truncated"), "{t:?}");
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn ids_resume_after_the_last_seen_and_nothing_follows_the_report() {
        let feed = Feed::new(100);
        feed.started(Stage::Run);
        let mut pen = feed.pen(None);
        pen.output(Stream::Stderr, b"x");
        feed.finish(Arc::new(report()));
        pen.output(Stream::Stdout, b"late");
        let (events, ended) = feed.after(2);
        assert!(ended);
        let ids: Vec<u64> = events.iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, vec![3, 4]);
        assert_eq!(events[1].1.name(), "report");
    }

    #[tokio::test]
    async fn a_feed_given_back_without_a_report_ends_for_its_waiting_readers() {
        let feed = Feed::new(1 << 20);
        let mut changes = feed.subscribe();
        changes.borrow_and_update();
        let waiter = tokio::spawn(async move { changes.changed().await.is_ok() });
        tokio::task::yield_now().await;
        feed.abandon();
        let woke = tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await;
        assert!(matches!(woke, Ok(Ok(true))), "a waiting reader wakes");
        let (events, ended) = feed.after(1);
        assert!(events.is_empty() && ended, "and finds the feed ended");
    }

    #[test]
    fn the_tail_is_the_last_lines_within_the_bytes() {
        let feed = Feed::new(1 << 20);
        let mut pen = feed.pen(None);
        for i in 0..30 {
            pen.output(Stream::Stdout, format!("line {i}\n").as_bytes());
        }
        let tail = feed.tail(3, 1024);
        assert_eq!(tail, "line 27\nline 28\nline 29");
        assert_eq!(feed.tail(10, 7), "line 29");
    }
}
