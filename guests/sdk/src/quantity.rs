//! Kubernetes resource quantities (`"10Gi"`, `"1.5G"`, `"1e9"`) as whole bytes, exactly
//! as the host and the API server read them.
//!
//! The grammar is Kubernetes' own (`apimachinery/pkg/api/resource`): an optional sign,
//! digits with an optional fraction, then one suffix — binary (`Ki` .. `Ei`), decimal
//! (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or an exponent (`e3`, `E-2`). The
//! arithmetic is exact (integers, no floating point), so `"1.1Gi"` is the same number
//! of bytes here as in the API server; a fractional number of bytes is rounded up, as
//! `Quantity.Value()` does (`"100m"` is 1 byte, never 0). Negative sizes, anything
//! beyond `u64` and anything that is not a quantity are errors. The same parser as the
//! host's (`host/rules/src/quantity.rs`), with the same tests.

use std::fmt;

/// Why a string is not a size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantityError {
    Syntax { value: String, why: &'static str },
    Negative { value: String },
    TooLarge { value: String },
}

/// Parses a Kubernetes quantity as a whole number of bytes, rounding a fraction up.
pub fn parse_quantity(value: &str) -> Result<u64, QuantityError> {
    let syntax = |why| QuantityError::Syntax {
        value: value.to_owned(),
        why,
    };
    let too_large = || QuantityError::TooLarge {
        value: value.to_owned(),
    };

    let bytes = value.as_bytes();
    let mut pos = 0;
    let mut negative = false;
    match bytes.first() {
        None => return Err(syntax("it is empty")),
        Some(b'+') => pos = 1,
        Some(b'-') => {
            negative = true;
            pos = 1;
        }
        _ => {}
    }

    let int_start = pos;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let int_digits = &value[int_start..pos];
    let mut frac_digits = "";
    if pos < bytes.len() && bytes[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        frac_digits = &value[frac_start..pos];
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(syntax("it has no digits"));
    }

    // value = mantissa * 10^exp10 * 2^exp2, the mantissa being all the digits.
    let (mut exp10, exp2): (i64, u32) = match &value[pos..] {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        suffix if suffix.starts_with(['e', 'E']) => (
            parse_exponent(&suffix[1..]).ok_or_else(|| syntax("its exponent is not an integer"))?,
            0,
        ),
        _ => {
            return Err(syntax(
                "its suffix is not one of Ki Mi Gi Ti Pi Ei n u m k M G T P E or an exponent",
            ));
        }
    };
    exp10 -= frac_digits.len() as i64;

    // Significant digits only: leading zeros add nothing, trailing zeros move the
    // decimal exponent. This keeps the mantissa small for "0.000001" and "1000000m".
    let all_digits = format!("{int_digits}{frac_digits}");
    let trimmed = all_digits.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    if significant.is_empty() {
        return Ok(0); // "-0" and "0.000" are zero, not negative.
    }
    if negative {
        return Err(QuantityError::Negative {
            value: value.to_owned(),
        });
    }
    exp10 += (trimmed.len() - significant.len()) as i64;
    // More than 38 significant digits cannot be held exactly; no real size needs them.
    if significant.len() > 38 {
        return Err(syntax("it has more than 38 significant digits"));
    }
    let mantissa: u128 = significant
        .parse()
        .map_err(|_| syntax("its digits do not parse"))?;
    let numerator = mantissa.checked_shl(exp2).filter(|n| n >> exp2 == mantissa);

    if exp10 >= 0 {
        // An integer: any overflow means it is far beyond u64.
        let scaled = numerator
            .and_then(|n| {
                10u128
                    .checked_pow(exp10.try_into().ok()?)
                    .and_then(|p| n.checked_mul(p))
            })
            .ok_or_else(too_large)?;
        u64::try_from(scaled).map_err(|_| too_large())
    } else {
        // A fraction: divide and round up.
        let numerator = numerator.ok_or_else(too_large)?;
        let divisor = u32::try_from(-exp10)
            .ok()
            .and_then(|e| 10u128.checked_pow(e));
        let Some(divisor) = divisor else {
            // The divisor exceeds u128 while the numerator is below it: 0 < value < 1.
            return Ok(1);
        };
        let quotient = numerator.div_ceil(divisor);
        u64::try_from(quotient).map_err(|_| too_large())
    }
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantityError::Syntax { value, why } => write!(
                f,
                "quantity {value:?} is not a Kubernetes quantity ({why}); write it like \"10Gi\", \"500M\" or \"1e9\""
            ),
            QuantityError::Negative { value } => {
                write!(
                    f,
                    "quantity {value:?} is negative; a size must be zero or more"
                )
            }
            QuantityError::TooLarge { value } => write!(
                f,
                "quantity {value:?} is too large; a size must fit in 64 bits of bytes (under 16Ei)"
            ),
        }
    }
}

impl std::error::Error for QuantityError {}

/// Formats bytes as a quantity: with the largest binary suffix that divides it
/// exactly (`1073741824` -> `"1Gi"`), else as a plain integer. Both parse back exactly.
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if bytes != 0 {
        for (suffix, shift) in SUFFIXES {
            if bytes.trailing_zeros() >= shift {
                return format!("{}{suffix}", bytes >> shift);
            }
        }
    }
    bytes.to_string()
}

/// A decimal exponent: an optional sign and digits, bounded so arithmetic stays sane.
fn parse_exponent(text: &str) -> Option<i64> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 6 {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(value: &str) -> u64 {
        parse_quantity(value).unwrap_or_else(|e| panic!("{value:?}: {e}"))
    }

    #[test]
    fn plain_integers() {
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("1"), 1);
        assert_eq!(ok("+1"), 1);
        assert_eq!(ok("007"), 7);
        assert_eq!(ok("18446744073709551615"), u64::MAX);
    }

    #[test]
    fn binary_suffixes() {
        assert_eq!(ok("1Ki"), 1024);
        assert_eq!(ok("1Mi"), 1 << 20);
        assert_eq!(ok("1Gi"), 1 << 30);
        assert_eq!(ok("10Gi"), 10 << 30);
        assert_eq!(ok("1Ti"), 1 << 40);
        assert_eq!(ok("1Pi"), 1 << 50);
        assert_eq!(ok("1Ei"), 1 << 60);
        assert_eq!(ok("15Ei"), 15 << 60);
        assert_eq!(ok("1.5Gi"), 1_610_612_736);
        // 1.1 * 2^30 = 1181116006.4 -> rounded up.
        assert_eq!(ok("1.1Gi"), 1_181_116_007);
    }

    #[test]
    fn decimal_suffixes() {
        assert_eq!(ok("1k"), 1_000);
        assert_eq!(ok("1M"), 1_000_000);
        assert_eq!(ok("500M"), 500_000_000);
        assert_eq!(ok("1G"), 1_000_000_000);
        assert_eq!(ok("1T"), 1_000_000_000_000);
        assert_eq!(ok("1P"), 1_000_000_000_000_000);
        assert_eq!(ok("1E"), 1_000_000_000_000_000_000);
        assert_eq!(ok("2.5G"), 2_500_000_000);
        assert_eq!(ok("18E"), 18_000_000_000_000_000_000);
    }

    #[test]
    fn sub_unit_suffixes_round_up() {
        assert_eq!(ok("100m"), 1);
        assert_eq!(ok("1000m"), 1);
        assert_eq!(ok("1001m"), 2);
        assert_eq!(ok("1500m"), 2);
        assert_eq!(ok("1u"), 1);
        assert_eq!(ok("1n"), 1);
        assert_eq!(ok("0m"), 0);
        assert_eq!(ok("1.1"), 2);
        assert_eq!(ok("0.5"), 1);
        assert_eq!(ok(".5"), 1);
        assert_eq!(ok("2."), 2);
    }

    #[test]
    fn exponents() {
        assert_eq!(ok("1e3"), 1_000);
        assert_eq!(ok("1E3"), 1_000);
        assert_eq!(ok("1e+3"), 1_000);
        assert_eq!(ok("1.5e3"), 1_500);
        assert_eq!(ok("12e-1"), 2);
        assert_eq!(ok("1e-3"), 1);
        assert_eq!(ok("1e0"), 1);
        assert_eq!(ok("1e-100"), 1);
        assert_eq!(ok("0e100"), 0);
        assert_eq!(ok("1e18"), 1_000_000_000_000_000_000);
    }

    #[test]
    fn zeros_are_zero_even_with_a_sign() {
        assert_eq!(ok("-0"), 0);
        assert_eq!(ok("0.000"), 0);
        assert_eq!(ok("0Gi"), 0);
    }

    #[test]
    fn long_mantissas_with_zeros_are_exact() {
        assert_eq!(ok("0.000000000000000000000000000000000000000000001Ei"), 1);
        // 10^21 milli-bytes: 22 digits, most of them zeros.
        assert_eq!(ok(&format!("1{}m", "0".repeat(21))), 10u64.pow(18));
        assert_eq!(ok(&format!("0.{}1Ei", "0".repeat(40))), 1);
    }

    #[test]
    fn refuses_negative_sizes() {
        for value in ["-1", "-1Gi", "-0.5", "-1e3"] {
            assert!(
                matches!(parse_quantity(value), Err(QuantityError::Negative { .. })),
                "{value:?}"
            );
        }
    }

    #[test]
    fn refuses_sizes_beyond_u64() {
        for value in [
            "18446744073709551616",
            "16Ei",
            "19E",
            "1e20",
            "1e999999",
            "99999999999999999999999999999999999999Ei",
        ] {
            assert!(
                matches!(parse_quantity(value), Err(QuantityError::TooLarge { .. })),
                "{value:?}: {:?}",
                parse_quantity(value)
            );
        }
    }

    #[test]
    fn refuses_garbage() {
        for value in [
            "",
            " ",
            " 1Gi",
            "1Gi ",
            "Gi",
            "1 Gi",
            "1KB",
            "1K",
            "1gi",
            "1GiB",
            "1.2.3",
            ".",
            "+",
            "-",
            "1e",
            "1e1.5",
            "1ee3",
            "e3",
            "1i",
            "0x10",
            "1,5Gi",
            "1Gi1",
            "--1",
            "1e1234567",
        ] {
            assert!(
                matches!(parse_quantity(value), Err(QuantityError::Syntax { .. })),
                "{value:?}: {:?}",
                parse_quantity(value)
            );
        }
    }

    #[test]
    fn errors_name_the_value_and_say_what_to_do() {
        let message = parse_quantity("10GB").unwrap_err().to_string();
        assert!(message.contains("\"10GB\""), "{message}");
        assert!(message.contains("10Gi"), "{message}");
    }

    #[test]
    fn formats_with_the_largest_exact_binary_suffix() {
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_bytes(1), "1");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(1024), "1Ki");
        assert_eq!(format_bytes(1536), "1536");
        assert_eq!(format_bytes(2048), "2Ki");
        assert_eq!(format_bytes(1 << 30), "1Gi");
        assert_eq!(format_bytes(3 << 29), "1536Mi");
        assert_eq!(format_bytes(15 << 60), "15Ei");
        assert_eq!(format_bytes(u64::MAX), "18446744073709551615");
    }

    #[test]
    fn formatting_round_trips() {
        for bytes in [
            0,
            1,
            999,
            1024,
            1 << 20,
            (1 << 30) + 1,
            5 << 40,
            u64::MAX,
            1 << 63,
        ] {
            assert_eq!(parse_quantity(&format_bytes(bytes)), Ok(bytes), "{bytes}");
        }
    }
}
