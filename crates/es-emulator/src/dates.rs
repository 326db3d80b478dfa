//! Dates as Elasticsearch's `date` fields read them: the default mapping format
//! `strict_date_optional_time||epoch_millis`, a few other built-in formats, and date math
//! (`now-2m`, `2024-01-01||+1M/d`) with the rounding rules of range queries
//! (`docs/elasticsearch.md` §7). UTC only.

const MS_SECOND: i64 = 1_000;
const MS_MINUTE: i64 = 60 * MS_SECOND;
const MS_HOUR: i64 = 60 * MS_MINUTE;
const MS_DAY: i64 = 24 * MS_HOUR;

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The (year, month, day) of a day count since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

/// `2024-01-02T03:04:05.678Z`: how `strict_date_optional_time` prints a date.
pub fn format_iso(millis: i64) -> String {
    let days = millis.div_euclid(MS_DAY);
    let rest = millis.rem_euclid(MS_DAY);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / MS_HOUR,
        rest % MS_HOUR / MS_MINUTE,
        rest % MS_MINUTE / MS_SECOND,
        rest % MS_SECOND
    )
}

/// The smallest component a date string gave, for rounding up partial dates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Precision {
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    Milli,
}

struct Cursor<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn digits(&mut self, min: usize, max: usize) -> Option<i64> {
        let start = self.pos;
        while self.pos < self.s.len() && self.pos - start < max && self.s[self.pos].is_ascii_digit()
        {
            self.pos += 1;
        }
        if self.pos - start < min {
            return None;
        }
        std::str::from_utf8(&self.s[start..self.pos])
            .ok()?
            .parse()
            .ok()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn done(&self) -> bool {
        self.pos == self.s.len()
    }
}

/// `strict_date_optional_time`: `yyyy[-MM[-dd]][T HH[:mm[:ss[.S…]]]][Z|±HH[:mm]]`.
fn parse_iso(text: &str) -> Option<(i64, Precision)> {
    let mut c = Cursor {
        s: text.as_bytes(),
        pos: 0,
    };
    let year = c.digits(4, 4)?;
    let (mut month, mut day, mut precision) = (1, 1, Precision::Year);
    if c.eat(b'-') {
        month = c.digits(2, 2)? as u32;
        precision = Precision::Month;
        if c.eat(b'-') {
            day = c.digits(2, 2)? as u32;
            precision = Precision::Day;
        }
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let mut millis = days_from_civil(year, month, day) * MS_DAY;
    if c.done() {
        return Some((millis, precision));
    }
    if precision != Precision::Day || !c.eat(b'T') {
        return None;
    }
    let hour = c.digits(2, 2)?;
    precision = Precision::Hour;
    let (mut minute, mut second, mut fraction) = (0, 0, 0);
    if c.eat(b':') {
        minute = c.digits(2, 2)?;
        precision = Precision::Minute;
        if c.eat(b':') {
            second = c.digits(2, 2)?;
            precision = Precision::Second;
            if c.eat(b'.') || c.eat(b',') {
                let start = c.pos;
                let digits = c.digits(1, 9)?;
                let len = (c.pos - start) as u32;
                // Nanoseconds are truncated to milliseconds.
                fraction = if len >= 3 {
                    digits / 10_i64.pow(len - 3)
                } else {
                    digits * 10_i64.pow(3 - len)
                };
                precision = Precision::Milli;
            }
        }
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    millis += hour * MS_HOUR + minute * MS_MINUTE + second * MS_SECOND + fraction;
    if c.eat(b'Z') {
    } else if c.s.get(c.pos).is_some_and(|b| *b == b'+' || *b == b'-') {
        let sign = if c.s[c.pos] == b'-' { -1 } else { 1 };
        c.pos += 1;
        let oh = c.digits(2, 2)?;
        c.eat(b':');
        let om = if c.done() { 0 } else { c.digits(2, 2)? };
        if oh > 18 || om > 59 {
            return None;
        }
        millis -= sign * (oh * MS_HOUR + om * MS_MINUTE);
    }
    c.done().then_some((millis, precision))
}

/// The last millisecond of the unit a partial date names (`2024-01` → end of January).
fn round_up_partial(millis: i64, precision: Precision) -> i64 {
    match precision {
        Precision::Year => add_months(millis, 12) - 1,
        Precision::Month => add_months(millis, 1) - 1,
        Precision::Day => millis + MS_DAY - 1,
        Precision::Hour => millis + MS_HOUR - 1,
        Precision::Minute => millis + MS_MINUTE - 1,
        Precision::Second => millis + MS_SECOND - 1,
        Precision::Milli => millis,
    }
}

fn parse_epoch(text: &str, scale: i64) -> Option<i64> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, f),
        None => (text, ""),
    };
    let digits = int.strip_prefix('-').unwrap_or(int);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    int.parse::<i64>().ok()?.checked_mul(scale)
}

/// Parses one date with `format` (`a||b` tries each; `None` is the default mapping format).
/// `round_up` rounds partial dates to their last millisecond (gt / lte bounds).
pub fn parse_with(text: &str, format: Option<&str>, round_up: bool) -> Result<i64, String> {
    let format = format.unwrap_or("strict_date_optional_time||epoch_millis");
    for one in format.split("||") {
        let parsed = match one.trim() {
            "epoch_millis" => parse_epoch(text, 1),
            "epoch_second" => parse_epoch(text, MS_SECOND),
            "strict_date_optional_time"
            | "date_optional_time"
            | "strict_date_optional_time_nanos"
            | "strict_date_time"
            | "date_time"
            | "strict_date"
            | "date"
            | "iso8601" => parse_iso(text).map(|(millis, precision)| {
                if round_up {
                    round_up_partial(millis, precision)
                } else {
                    millis
                }
            }),
            other => {
                return Err(format!(
                    "Invalid format: [{other}]: not supported by es-emulator"
                ))
            }
        };
        if let Some(millis) = parsed {
            return Ok(millis);
        }
    }
    Err(format!(
        "failed to parse date field [{text}] with format [{format}]"
    ))
}

/// A date from a JSON value: numbers are epoch millis (or seconds with `epoch_second`).
pub fn parse_value(
    value: &serde_json::Value,
    format: Option<&str>,
    round_up: bool,
) -> Result<i64, String> {
    match value {
        serde_json::Value::String(s) => parse_with(s, format, round_up),
        serde_json::Value::Number(n) => {
            let scale = if format == Some("epoch_second") {
                MS_SECOND
            } else {
                1
            };
            n.as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map(|v| v.saturating_mul(scale))
                .ok_or_else(|| format!("failed to parse date field [{n}]"))
        }
        other => Err(format!("failed to parse date field [{other}]")),
    }
}

fn add_months(millis: i64, months: i64) -> i64 {
    let days = millis.div_euclid(MS_DAY);
    let time = millis.rem_euclid(MS_DAY);
    let (y, m, d) = civil_from_days(days);
    let total = y * 12 + i64::from(m) - 1 + months;
    let (ny, nm) = (total.div_euclid(12), (total.rem_euclid(12) + 1) as u32);
    let nd = d.min(days_in_month(ny, nm));
    days_from_civil(ny, nm, nd) * MS_DAY + time
}

fn add_unit(millis: i64, amount: i64, unit: u8) -> Option<i64> {
    Some(match unit {
        b'y' => add_months(millis, amount.checked_mul(12)?),
        b'M' => add_months(millis, amount),
        b'w' => millis.checked_add(amount.checked_mul(7 * MS_DAY)?)?,
        b'd' => millis.checked_add(amount.checked_mul(MS_DAY)?)?,
        b'h' | b'H' => millis.checked_add(amount.checked_mul(MS_HOUR)?)?,
        b'm' => millis.checked_add(amount.checked_mul(MS_MINUTE)?)?,
        b's' => millis.checked_add(amount.checked_mul(MS_SECOND)?)?,
        _ => return None,
    })
}

/// Rounds down to the start of `unit` (weeks start on Monday).
fn round_down(millis: i64, unit: u8) -> Option<i64> {
    let days = millis.div_euclid(MS_DAY);
    Some(match unit {
        b'y' => {
            let (y, _, _) = civil_from_days(days);
            days_from_civil(y, 1, 1) * MS_DAY
        }
        b'M' => {
            let (y, m, _) = civil_from_days(days);
            days_from_civil(y, m, 1) * MS_DAY
        }
        b'w' => (days - (days + 3).rem_euclid(7)) * MS_DAY,
        b'd' => days * MS_DAY,
        b'h' | b'H' => millis.div_euclid(MS_HOUR) * MS_HOUR,
        b'm' => millis.div_euclid(MS_MINUTE) * MS_MINUTE,
        b's' => millis.div_euclid(MS_SECOND) * MS_SECOND,
        _ => return None,
    })
}

/// Evaluates a date-math expression: `now`, `now-2m`, `now/d`, `<date>||+1M/d`, or a plain
/// date. `round_up` is true for `gt` and `lte` bounds: roundings then go to the last
/// millisecond of the unit, and partial plain dates to their last millisecond.
pub fn eval_math(
    expr: &str,
    now_millis: i64,
    format: Option<&str>,
    round_up: bool,
) -> Result<i64, String> {
    let (mut value, math) = if let Some(rest) = expr.strip_prefix("now") {
        (now_millis, rest)
    } else if let Some((anchor, rest)) = expr.split_once("||") {
        (parse_with(anchor, format, false)?, rest)
    } else {
        return parse_with(expr, format, round_up);
    };
    let bad = || format!("operator not supported for date math [{expr}]");
    let bytes = math.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let op = bytes[i];
        i += 1;
        if op == b'/' {
            let unit = *bytes.get(i).ok_or_else(bad)?;
            i += 1;
            let down = round_down(value, unit).ok_or_else(bad)?;
            value = if round_up {
                add_unit(down, 1, unit).ok_or_else(bad)? - 1
            } else {
                down
            };
        } else if op == b'+' || op == b'-' {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let amount: i64 = if start == i {
                1
            } else {
                math[start..i].parse().map_err(|_| bad())?
            };
            let unit = *bytes.get(i).ok_or_else(bad)?;
            i += 1;
            let signed = if op == b'-' { -amount } else { amount };
            value = add_unit(value, signed, unit).ok_or_else(bad)?;
        } else {
            return Err(bad());
        }
    }
    Ok(value)
}

/// Milliseconds since the epoch, now.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
