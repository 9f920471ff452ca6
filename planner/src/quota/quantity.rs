//! Counts read from Kubernetes quantities. The API server stores a ResourceQuota's `hard` and
//! `used` in canonical form (`1000` becomes `1k`, `1e3` stays an exponent), so a plain integer
//! parse fails on real objects. Devices are whole: a fractional value (`500m`) rounds up, the
//! conservative side for a limit in force or a usage compared against one.

/// The count a quantity stands for, rounded up to a whole number: integers with a decimal
/// (`k`, `M`, `G`, `T`, `P`, `E`, and `m`, `u`, `n`), binary (`Ki` .. `Ei`) or exponent
/// (`e3`, `E-2`) suffix. `None` for anything else, or past `i64`: taken as unknown.
pub fn count(q: &str) -> Option<i64> {
    parse(q).map(|(n, _)| n)
}

/// Whether `q` is exactly the whole number `n` (`1k` is `1000`; `1500m` is not `2`).
pub fn is_exactly(q: &str, n: i64) -> bool {
    parse(q) == Some((n, true))
}

/// (value rounded up, whether it was whole).
fn parse(q: &str) -> Option<(i64, bool)> {
    let q = q.trim();
    let (negative, rest) = match q.as_bytes().first()? {
        b'-' => (true, &q[1..]),
        b'+' => (false, &q[1..]),
        _ => (false, q),
    };
    let end = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') || int.len() + frac.len() > 30 {
        return None;
    }
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) && s.len() > 1 => {
            let e: i32 = s[1..].parse().ok()?;
            if !(-40..=40).contains(&e) {
                return None;
            }
            (e, 0)
        }
        _ => return None,
    };
    let digits = format!("{int}{frac}");
    let mut mantissa: i128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    mantissa = mantissa.checked_mul(1i128 << exp2)?;
    let exp = exp10 - frac.len() as i32;
    let (mut value, mut whole) = (mantissa, true);
    if exp >= 0 {
        value = value.checked_mul(10i128.checked_pow(exp as u32)?)?;
    } else {
        let div = 10i128.checked_pow(exp.unsigned_abs())?;
        whole = value % div == 0;
        value = value / div + i128::from(!whole && !negative);
    }
    let value = if negative { -value } else { value };
    Some((i64::try_from(value).ok()?, whole))
}

#[cfg(test)]
mod tests;
