//! The panic boundary: code we do not control (tract, the CUDA libraries' wrappers) may still
//! panic on a model it accepted, so every engine build and run goes through [`catch`], which turns
//! a panic into an error value carrying the panic's message and location. The other rows of a
//! run are still produced, and the app or CLI stays up.

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};

thread_local! {
    /// Depth of [`catch`] calls on this thread: inside one, the hook records instead of printing.
    static DEPTH: RefCell<usize> = const { RefCell::new(0) };
    /// Where the last caught panic happened (file:line), filled by the hook.
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs a panic hook that stays quiet for panics [`catch`] turns into errors (their message
/// reaches the user as an error row instead) and prints every other panic as before.
pub fn install_hook() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let inside = DEPTH.with(|d| *d.borrow() > 0);
        if inside {
            let loc = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            LOCATION.with(|l| *l.borrow_mut() = loc);
        } else {
            default(info);
        }
    }));
}

/// The text of a panic payload (`&str` or `String`; anything else is named as such).
pub fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs `f`; a panic becomes `Err("internal error while {what}: {message} (at {location})")`.
pub fn catch<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    DEPTH.with(|d| *d.borrow_mut() += 1);
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    DEPTH.with(|d| *d.borrow_mut() -= 1);
    r.map_err(|payload| {
        let at = LOCATION
            .with(|l| l.borrow_mut().take())
            .map(|l| format!(" (at {l})"))
            .unwrap_or_default();
        format!(
            "internal error while {what}: {}{at}. The other results are unaffected; please report this model",
            payload_text(payload.as_ref())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        install_hook();
        let r: Result<(), String> = catch("building FP32", || panic!("index out of bounds"));
        let e = r.unwrap_err();
        assert!(e.contains("building FP32"), "{e}");
        assert!(e.contains("index out of bounds"), "{e}");
        assert!(e.contains("guard.rs"), "the location is kept: {e}");
        assert_eq!(catch("x", || 7), Ok(7));
    }
}
