//! CPU time of a process from `/proc/PID/stat`: utime + stime (fields 14 and 15) in clock
//! ticks, summed over all its threads, exactly as `perf/cpu_per_req.sh` reads it.

/// utime + stime of `pid` (or `"self"`), in clock ticks.
pub fn cpu_ticks(pid: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    parse_stat(&text).ok_or_else(|| format!("unexpected format of {path}"))
}

/// utime + stime from the text of a `stat` file. The command name (field 2) is in parentheses
/// and may itself contain spaces and parentheses, so fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    // After ")": field 3 (state) is index 0, so field N is index N - 3.
    let mut fields = rest.split_whitespace();
    let utime: u64 = fields.nth(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`).
pub fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// Microseconds of CPU per request for `ticks` clock ticks spent over `requests` requests.
pub fn us_per_request(ticks: u64, requests: u64) -> Option<f64> {
    (requests > 0).then(|| ticks as f64 / clk_tck() as f64 * 1e6 / requests as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines() {
        let line = "7726 (mmc-server) S 1 7726 1 0 -1 4194560 1230 0 0 0 157 42 0 0 20 0 3 0 \
                    171828 1234 567 18446744073709551615";
        assert_eq!(parse_stat(line), Some(157 + 42));
        // A command name with spaces and parentheses.
        let odd = "1 (a) b (c)) R 1 1 1 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_stat(odd), Some(15));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn reads_itself() {
        assert!(cpu_ticks("self").is_ok());
        assert!(clk_tck() > 0);
        assert_eq!(us_per_request(100, 0), None);
        let per = us_per_request(clk_tck(), 1_000_000).unwrap();
        assert!((per - 1.0).abs() < 1e-9);
    }
}
