//! `tessera-operator validate` on arbitrary bytes: any UTF-8 text must give a report, never a
//! panic, an abort or unbounded memory.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_cli::validate::{Report, validate_text};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let mut report = Report::default();
        validate_text("fuzz.yaml", text, &mut report);
    }
});
