//! Structured logging through the host's `log` import.
//!
//! ```ignore
//! use wasm_provisioner_sdk::log;
//! log::info!("created directory", path = dir, volume = req.volume_name);
//! log::warn!(format!("retrying {n}"));
//! ```
//!
//! The first argument is the message (anything `Display`); then `key = value` pairs
//! (values are `Display`; keys are identifiers or string literals such as `"pv-name"`).
//! Natively (tests) lines go to stderr.

pub use crate::bindings::wasm_provisioner::plugin::log::Level;
use std::fmt::Display;

/// Writes one log line at `level` with `fields`.
pub fn log(level: Level, message: &str, fields: &[(&str, &dyn Display)]) {
    let fields: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    write(level, message, &fields);
}

#[cfg(target_arch = "wasm32")]
fn write(level: Level, message: &str, fields: &[(String, String)]) {
    crate::bindings::wasm_provisioner::plugin::log::log(level, message, fields);
}

#[cfg(not(target_arch = "wasm32"))]
fn write(level: Level, message: &str, fields: &[(String, String)]) {
    let mut line = format!("[{level:?}] {message}");
    for (k, v) in fields {
        line.push_str(&format!(" {k}={v:?}"));
    }
    eprintln!("{line}");
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log {
    ($level:expr, $msg:expr $(, $key:tt = $value:expr)* $(,)?) => {
        $crate::log::log(
            $level,
            &::std::string::ToString::to_string(&$msg),
            &[$(($crate::__log_key!($key), &$value as &dyn ::core::fmt::Display)),*],
        )
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_key {
    ($key:ident) => {
        stringify!($key)
    };
    ($key:literal) => {
        $key
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_trace {
    ($($t:tt)*) => { $crate::__log!($crate::log::Level::Trace, $($t)*) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __log_debug {
    ($($t:tt)*) => { $crate::__log!($crate::log::Level::Debug, $($t)*) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __log_info {
    ($($t:tt)*) => { $crate::__log!($crate::log::Level::Info, $($t)*) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __log_warn {
    ($($t:tt)*) => { $crate::__log!($crate::log::Level::Warn, $($t)*) };
}
#[doc(hidden)]
#[macro_export]
macro_rules! __log_error {
    ($($t:tt)*) => { $crate::__log!($crate::log::Level::Error, $($t)*) };
}

pub use crate::__log_debug as debug;
pub use crate::__log_error as error;
pub use crate::__log_info as info;
pub use crate::__log_trace as trace;
pub use crate::__log_warn as warn;

#[cfg(test)]
mod tests {
    #[test]
    fn macros_expand() {
        let name = "pvc-1";
        crate::log::info!("hello");
        crate::log::warn!("with fields", volume = name, "pv-size" = 5,);
        crate::log::error!(format!("n={}", 3), ok = true);
        crate::log::debug!("d");
        crate::log::trace!("t");
    }
}
