//! The logging capability: the `log` import of the world, and guest stdout/stderr.
//!
//! Both go to the host's `tracing` log (target `guest`), tagged with the module, its
//! version and the call. Both are bounded per call, so a chatty or hostile guest cannot
//! flood the host's log: past the bound, lines are dropped and one warning says so.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use super::bindings::log::Level;

/// Most log lines (the import and stdout/stderr together) one call may write.
pub const MAX_LOG_LINES_PER_CALL: usize = 1000;
/// Longest log message kept; longer ones are cut.
pub const MAX_LOG_LINE_BYTES: usize = 4096;
/// Most extra fields of one log line.
pub const MAX_LOG_FIELDS: usize = 32;

/// Who is logging: one call of one module version.
#[derive(Debug, Clone)]
pub(crate) struct CallTag {
    pub(crate) module: Arc<str>,
    pub(crate) version: Arc<str>,
    pub(crate) call: &'static str,
}

/// The log sink of one call, shared by the import and the stdio streams.
#[derive(Clone)]
pub(crate) struct GuestLog {
    inner: Arc<Mutex<LogState>>,
}

struct LogState {
    tag: CallTag,
    lines: usize,
    dropped: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl GuestLog {
    pub(crate) fn new(tag: CallTag) -> Self {
        GuestLog {
            inner: Arc::new(Mutex::new(LogState {
                tag,
                lines: 0,
                dropped: 0,
                stdout: Vec::new(),
                stderr: Vec::new(),
            })),
        }
    }

    /// One line from the `log` import.
    pub(crate) fn log(&self, level: Level, message: &str, fields: &[(String, String)]) {
        let mut state = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !state.admit() {
            return;
        }
        let message = truncate(message, MAX_LOG_LINE_BYTES);
        let fields = render_fields(fields);
        let CallTag {
            module,
            version,
            call,
        } = &state.tag;
        let (module, version) = (&**module, &**version);
        match level {
            Level::Trace => {
                tracing::trace!(target: "guest", module, version, call, fields = %fields, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: "guest", module, version, call, fields = %fields, "{message}")
            }
            Level::Info => {
                tracing::info!(target: "guest", module, version, call, fields = %fields, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "guest", module, version, call, fields = %fields, "{message}")
            }
            Level::Error => {
                tracing::error!(target: "guest", module, version, call, fields = %fields, "{message}")
            }
        }
    }

    /// A stream for the guest's stdout (`stderr` false) or stderr (`stderr` true).
    pub(crate) fn stdio(&self, stderr: bool) -> GuestStdio {
        GuestStdio {
            log: self.clone(),
            stderr,
        }
    }

    fn write_stdio(&self, stderr: bool, bytes: &[u8]) {
        let mut state = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut rest = bytes;
        loop {
            let (chunk, line_ends) = match rest.iter().position(|&b| b == b'\n') {
                Some(newline) => (&rest[..newline], true),
                None => (rest, false),
            };
            rest = if line_ends {
                &rest[chunk.len() + 1..]
            } else {
                &[]
            };
            let buffer = state.buffer(stderr);
            // Never keep more than one line's worth: the rest of an over-long line is cut.
            let room = (MAX_LOG_LINE_BYTES + 1).saturating_sub(buffer.len());
            buffer.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if !line_ends {
                break;
            }
            let line = std::mem::take(state.buffer(stderr));
            state.emit_stdio(stderr, &line);
        }
    }
}

impl LogState {
    fn buffer(&mut self, stderr: bool) -> &mut Vec<u8> {
        if stderr {
            &mut self.stderr
        } else {
            &mut self.stdout
        }
    }

    fn admit(&mut self) -> bool {
        if self.lines < MAX_LOG_LINES_PER_CALL {
            self.lines += 1;
            true
        } else {
            self.dropped += 1;
            false
        }
    }

    fn emit_stdio(&mut self, stderr: bool, line: &[u8]) {
        if !self.admit() {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let text = truncate(text.trim_end_matches('\r'), MAX_LOG_LINE_BYTES);
        let stream = if stderr { "stderr" } else { "stdout" };
        let CallTag {
            module,
            version,
            call,
        } = &self.tag;
        let (module, version) = (&**module, &**version);
        tracing::info!(target: "guest", module, version, call, stream, "{text}");
    }
}

impl Drop for LogState {
    fn drop(&mut self) {
        for stderr in [false, true] {
            let rest = std::mem::take(if stderr {
                &mut self.stderr
            } else {
                &mut self.stdout
            });
            if !rest.is_empty() {
                self.emit_stdio(stderr, &rest);
            }
        }
        if self.dropped > 0 {
            let CallTag {
                module,
                version,
                call,
            } = &self.tag;
            let (module, version) = (&**module, &**version);
            tracing::warn!(
                target: "guest", module, version, call, dropped = self.dropped,
                "the guest wrote more than {MAX_LOG_LINES_PER_CALL} log lines in one call; the rest were dropped"
            );
        }
    }
}

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn render_fields(fields: &[(String, String)]) -> String {
    let mut out = String::new();
    for (key, value) in fields.iter().take(MAX_LOG_FIELDS) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(truncate(key, 128));
        out.push('=');
        out.push_str(truncate(value, 1024));
    }
    out
}

/// Guest stdout or stderr, line-buffered into the host log.
pub(crate) struct GuestStdio {
    log: GuestLog,
    stderr: bool,
}

impl IsTerminal for GuestStdio {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestStdio {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(GuestStdioWriter {
            log: self.log.clone(),
            stderr: self.stderr,
        })
    }
}

struct GuestStdioWriter {
    log: GuestLog,
    stderr: bool,
}

impl AsyncWrite for GuestStdioWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        // Always accept everything: a guest whose print fails may panic (Rust's
        // `println!` does), and dropping excess lines is the host's business.
        self.log.write_stdio(self.stderr, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> CallTag {
        CallTag {
            module: "m".into(),
            version: "0123456789ab".into(),
            call: "provision",
        }
    }

    #[test]
    fn stdio_is_split_into_lines_and_bounded() {
        let log = GuestLog::new(tag());
        log.write_stdio(false, b"one\ntw");
        log.write_stdio(false, b"o\nthree");
        {
            let state = log.inner.lock().unwrap();
            assert_eq!(state.lines, 2);
            assert_eq!(state.stdout, b"three");
        }
        let long = vec![b'x'; 3 * MAX_LOG_LINE_BYTES];
        log.write_stdio(true, &long);
        assert!(log.inner.lock().unwrap().stderr.len() <= MAX_LOG_LINE_BYTES + 1);
    }

    #[test]
    fn lines_past_the_bound_are_counted_and_dropped() {
        let log = GuestLog::new(tag());
        for _ in 0..MAX_LOG_LINES_PER_CALL + 5 {
            log.log(Level::Info, "hello", &[]);
        }
        let state = log.inner.lock().unwrap();
        assert_eq!(state.lines, MAX_LOG_LINES_PER_CALL);
        assert_eq!(state.dropped, 5);
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
