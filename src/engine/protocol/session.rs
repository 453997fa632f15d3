//! Requests to a session's codebox-init.
