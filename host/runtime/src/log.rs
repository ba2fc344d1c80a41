//! The logging capability: the `log` import of the world, and guest stdout/stderr.
//!
//! Both go to the host's `tracing` log (target `guest`), tagged with the module, its
//! version and the call. Both are bounded per call, so a chatty or hostile guest cannot
//! flood the host's log: at most [`MAX_LOG_LINES_PER_CALL`] lines and a byte budget
//! (`--guest-log-bytes-per-call`, messages and fields together); past either bound the
//! rest is dropped, counted per module, and one warning at the end of the call says how
//! many bytes. Control characters (newline, CR, ESC, other C0 and C1 controls, line
//! separators, bidi overrides) in messages, field keys and values are escaped, so a
//! guest cannot forge host log lines or terminal output in either log format.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use super::bindings::log::Level;
use super::limits::DEFAULT_GUEST_LOG_BYTES_PER_CALL;
use super::metrics::Metrics;

/// Most log lines (the import and stdout/stderr together) one call may write.
pub const MAX_LOG_LINES_PER_CALL: usize = 1000;
/// Longest log message kept; longer ones are cut.
pub const MAX_LOG_LINE_BYTES: usize = 4096;
/// Most extra fields of one log line.
pub const MAX_LOG_FIELDS: usize = 32;
/// Longest field key and value kept.
const MAX_FIELD_KEY_BYTES: usize = 128;
const MAX_FIELD_VALUE_BYTES: usize = 1024;

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
    /// Lines dropped whole (past the line or byte bound).
    dropped: usize,
    /// Bytes of log the guest may still write in this call.
    bytes_left: usize,
    /// The budget this call started with (for the warning).
    bytes_per_call: usize,
    /// Bytes the guest wrote that did not reach the log: dropped lines, cut lines, cut
    /// fields.
    dropped_bytes: u64,
    /// Where the dropped bytes are counted per module, at the end of the call.
    metrics: Option<Arc<Metrics>>,
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
                bytes_left: DEFAULT_GUEST_LOG_BYTES_PER_CALL,
                bytes_per_call: DEFAULT_GUEST_LOG_BYTES_PER_CALL,
                dropped_bytes: 0,
                metrics: None,
                stdout: Vec::new(),
                stderr: Vec::new(),
            })),
        }
    }

    /// Sets this call's byte budget and where dropped bytes are counted. Called once,
    /// right after the store is made, before the guest runs.
    pub(crate) fn configure(&self, bytes_per_call: usize, metrics: Arc<Metrics>) {
        let mut state = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        state.bytes_left = bytes_per_call;
        state.bytes_per_call = bytes_per_call;
        state.metrics = Some(metrics);
    }

    /// One line from the `log` import.
    pub(crate) fn log(&self, level: Level, message: &str, fields: &[(String, String)]) {
        let mut state = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let written = fields
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .fold(message.len(), usize::saturating_add);
        let kept_message = truncate(message, MAX_LOG_LINE_BYTES);
        let kept_fields = fields.iter().take(MAX_LOG_FIELDS).map(|(k, v)| {
            (
                truncate(k, MAX_FIELD_KEY_BYTES),
                truncate(v, MAX_FIELD_VALUE_BYTES),
            )
        });
        let kept = kept_fields
            .clone()
            .map(|(k, v)| k.len() + v.len())
            .fold(kept_message.len(), usize::saturating_add);
        if !state.admit(written, kept) {
            return;
        }
        let message = escape(kept_message);
        let fields = render_fields(kept_fields);
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

    /// Ends the call's log, right after the call: flushes unterminated lines, counts
    /// and reports the dropped bytes. Not left to the last clone's drop: wasmtime-wasi's
    /// stdout adapter task may hold one a moment after the store is gone.
    pub(crate) fn finish(&self) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .finish();
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
            let kept = chunk.len().min(room);
            buffer.extend_from_slice(&chunk[..kept]);
            state.dropped_bytes += (chunk.len() - kept) as u64;
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

    /// Whether a line the guest wrote as `written` bytes, of which `kept` survive the
    /// per-line cuts, goes to the log: within the line bound and the byte budget.
    /// Counts what is dropped either way.
    fn admit(&mut self, written: usize, kept: usize) -> bool {
        if self.lines < MAX_LOG_LINES_PER_CALL && kept <= self.bytes_left {
            self.lines += 1;
            self.bytes_left -= kept;
            self.dropped_bytes += written.saturating_sub(kept) as u64;
            true
        } else {
            self.dropped += 1;
            self.dropped_bytes += written as u64;
            false
        }
    }

    fn emit_stdio(&mut self, stderr: bool, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let trimmed = text.trim_end_matches('\r');
        let kept = truncate(trimmed, MAX_LOG_LINE_BYTES);
        if !self.admit(line.len(), kept.len()) {
            return;
        }
        let text = escape(kept);
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
        self.finish();
    }
}

impl LogState {
    /// Ends the call's log: flushes unterminated stdout/stderr lines and reports what
    /// was dropped (metric and one warning), once.
    fn finish(&mut self) {
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
        if self.dropped_bytes > 0 {
            let CallTag {
                module,
                version,
                call,
            } = &self.tag;
            if let Some(metrics) = &self.metrics {
                metrics.record_log_dropped(module, self.dropped_bytes);
            }
            let (module, version) = (&**module, &**version);
            tracing::warn!(
                target: "guest", module, version, call, dropped_lines = self.dropped,
                "{} bytes of guest log dropped: a call may log at most {} bytes \
                 (--guest-log-bytes-per-call) in {MAX_LOG_LINES_PER_CALL} lines of at most \
                 {MAX_LOG_LINE_BYTES} bytes",
                self.dropped_bytes, self.bytes_per_call
            );
        }
        self.dropped_bytes = 0;
        self.dropped = 0;
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

/// Whether `c` must not reach a log line as it is: C0 and C1 controls and DEL (newline,
/// carriage return, ESC and the rest), Unicode line and paragraph separators, and the
/// bidirectional overrides that make a terminal show text in another order.
fn is_dangerous(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
        )
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// Appends `c`, escaped if dangerous (`\n`, `\r`, `\t`, else `\u{..}`).
fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if is_dangerous(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// `text` with every dangerous character escaped, so a guest's text stays on the one
/// log line the host writes for it.
fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_dangerous) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

/// The fields as `key="value"` pairs: values quoted (`"` and `\` escaped) so a value
/// cannot pose as more fields; spaces, `=` and `"` in keys become `_`; dangerous
/// characters escaped in both.
fn render_fields<'a>(fields: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (key, value) in fields {
        if !out.is_empty() {
            out.push(' ');
        }
        for c in key.chars() {
            match c {
                ' ' | '=' | '"' => out.push('_'),
                c => push_escaped(&mut out, c),
            }
        }
        out.push_str("=\"");
        for c in value.chars() {
            if matches!(c, '"' | '\\') {
                out.push('\\');
            }
            push_escaped(&mut out, c);
        }
        out.push('"');
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
    fn bytes_past_the_budget_are_dropped_and_counted() {
        let log = GuestLog::new(tag());
        let metrics = Arc::new(Metrics::default());
        log.configure(100, metrics.clone());
        log.log(Level::Info, &"a".repeat(60), &[("k".into(), "v".repeat(9))]);
        // 70 bytes in, 30 left: a 40-byte line is dropped whole, a 30-byte one fits.
        log.log(Level::Info, &"b".repeat(40), &[]);
        log.write_stdio(false, format!("{}\n", "c".repeat(30)).as_bytes());
        log.log(Level::Info, "d", &[]);
        {
            let state = log.inner.lock().unwrap();
            assert_eq!(state.lines, 2);
            assert_eq!(state.bytes_left, 0);
            assert_eq!(state.dropped, 2);
            assert_eq!(state.dropped_bytes, 41);
        }
        drop(log);
        assert_eq!(metrics.module("m").guest_log_dropped_bytes_total, 41);
    }

    #[test]
    fn cut_lines_count_as_dropped_bytes() {
        let log = GuestLog::new(tag());
        log.configure(1 << 20, Arc::new(Metrics::default()));
        let long = vec![b'x'; MAX_LOG_LINE_BYTES + 100];
        log.write_stdio(true, &long);
        log.write_stdio(true, b"\n");
        log.log(Level::Info, &"y".repeat(MAX_LOG_LINE_BYTES + 7), &[]);
        let state = log.inner.lock().unwrap();
        // stdio keeps one byte more than a line before cutting, then cuts the line.
        assert_eq!(state.dropped_bytes, 99 + 1 + 7);
        assert_eq!(state.dropped, 0);
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape("ok\n2026-01-01T00:00:00Z  INFO forged\r\x1b[2J\u{85}\u{202e}x\t"),
            "ok\\n2026-01-01T00:00:00Z  INFO forged\\r\\u{1b}[2J\\u{85}\\u{202e}x\\t"
        );
        assert!(matches!(escape("plain text é"), Cow::Borrowed(_)));
        let fields =
            render_fields([("a key=\n", "v\"al\\ue\nmodule=evil"), ("ok", "fine")].into_iter());
        assert_eq!(
            fields,
            "a_key_\\n=\"v\\\"al\\\\ue\\nmodule=evil\" ok=\"fine\""
        );
        assert!(!fields.chars().any(is_dangerous));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
