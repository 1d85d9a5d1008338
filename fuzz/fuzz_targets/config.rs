//! The configuration file parser (`Config::defaults()`, `apply_file_text`, `validate`) and the
//! value parsers of `mmc::config::values`.
//!
//! The input is the text of a config file (invalid UTF-8 is replaced, as a lossy read would).
//! The value parsers get the whole text and each of its lines.
//!
//! Properties: no panic; every error renders (`to_string()`) to one line (no `\n` or `\r`);
//! a valid configuration renders (`render()`) to a file that reads back to the same
//! configuration; accepted host:port pairs print back to themselves; CPU lists have no
//! repeats.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmc::config::Config;
use mmc::config::values::{HostPort, parse_cpu_list, parse_size, parse_url};

fn one_line(what: &str, s: &str) {
    assert!(
        !s.contains(['\n', '\r']),
        "{what} error is not one line: {s:?}"
    );
}

fn values(s: &str) {
    if let Err(e) = parse_size(s) {
        one_line("parse_size", e);
    }
    match parse_cpu_list(s) {
        Ok(cpus) => {
            assert!(!cpus.is_empty());
            for (i, c) in cpus.iter().enumerate() {
                assert!(*c < 4096);
                assert!(!cpus[..i].contains(c), "repeated cpu {c}");
            }
        }
        Err(e) => one_line("parse_cpu_list", &e),
    }
    match parse_url(s) {
        Ok((_, hp)) => assert_eq!(HostPort::parse(&hp.to_string()), Ok(hp)),
        Err(e) => one_line("parse_url", e),
    }
    match HostPort::parse(s) {
        Ok(hp) => assert_eq!(HostPort::parse(&hp.to_string()), Ok(hp)),
        Err(e) => one_line("HostPort::parse", e),
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut c = Config::defaults();
    let applied = c.apply_file_text("fuzz.conf", &text);
    match &applied {
        Ok(_) => match c.validate() {
            Ok(()) => {
                // What --print-config shows reads back to the same configuration.
                let rendered = c.render();
                let mut again = Config::defaults();
                again
                    .apply_file_text("rendered.conf", &rendered)
                    .expect("a rendered configuration reads back");
                again
                    .validate()
                    .expect("a rendered configuration validates");
                assert_eq!(again.render(), rendered);
            }
            Err(e) => one_line("validate", &e.to_string()),
        },
        Err(e) => one_line("apply_file_text", &e.to_string()),
    }

    values(&text);
    for line in text.lines().take(64) {
        values(line);
        if let Some((_, v)) = line.split_once('=') {
            values(v);
        }
    }
});
