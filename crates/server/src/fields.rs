//! Typed reads of one JSON object's fields, each refusal naming the field.
//!
//! Invariants: `null` reads as absent (OpenAI clients send `"stop": null` and the like); a
//! number is range-checked as f64/i64/u64 before it is narrowed, so `1e30`, `-1` or `NaN`-like
//! inputs are refused, never wrapped or saturated.

use serde_json::{Map, Value};

use crate::errors::ApiError;

/// A request object (or a nested one, like `stream_options`).
#[derive(Clone, Copy)]
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    /// The field's value; `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(key, "a boolean", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(key, "a string", v)),
        }
    }

    pub fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(v) => Err(wrong_type(key, "an object", v)),
        }
    }

    /// A number in `lo..=hi`, as f32.
    pub fn float(&self, key: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let Some(x) = v.as_f64() else {
            return Err(wrong_type(key, "a number", v));
        };
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::field(
                key,
                format!("`{key}` must be from {lo} to {hi}, got {x}"),
            ));
        }
        Ok(Some(x as f32))
    }

    /// An integer in `lo..=hi`.
    pub fn uint(&self, key: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match integer(v) {
            Some(Int::U(n)) if (lo..=hi).contains(&n) => Ok(Some(n)),
            Some(_) => {
                Err(ApiError::field(key, format!("`{key}` must be from {lo} to {hi}, got {v}")))
            }
            None => Err(wrong_type(key, "an integer", v)),
        }
    }

    /// A signed integer in `lo..=hi`.
    pub fn int(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let range = || ApiError::field(key, format!("`{key}` must be from {lo} to {hi}, got {v}"));
        match integer(v) {
            Some(Int::I(n)) if (lo..=hi).contains(&n) => Ok(Some(n)),
            Some(Int::U(n)) => match i64::try_from(n) {
                Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                _ => Err(range()),
            },
            Some(_) => Err(range()),
            None => Err(wrong_type(key, "an integer", v)),
        }
    }

    /// A seed: any integer that fits 64 bits, signed ones taken as their two's complement.
    pub fn seed(&self, key: &str) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match integer(v) {
            Some(Int::U(n)) => Ok(Some(n)),
            Some(Int::I(n)) => Ok(Some(n as u64)),
            None => Err(wrong_type(key, "an integer (64 bits)", v)),
        }
    }
}

enum Int {
    U(u64),
    /// Negative.
    I(i64),
}

/// An integer, or a float with no fraction that fits 64 bits (`2.0` from clients that send
/// every number as a float).
fn integer(v: &Value) -> Option<Int> {
    if let Some(n) = v.as_u64() {
        return Some(Int::U(n));
    }
    if let Some(n) = v.as_i64() {
        return Some(Int::I(n));
    }
    let x = v.as_f64()?;
    // -2^63 and 2^64 (what `u64::MAX as f64` rounds to) are exact in f64, so the casts below
    // are in range by this check.
    if x.fract() != 0.0 || !(i64::MIN as f64..u64::MAX as f64).contains(&x) {
        return None;
    }
    Some(if x >= 0.0 { Int::U(x as u64) } else { Int::I(x as i64) })
}

fn wrong_type(key: &str, want: &str, got: &Value) -> ApiError {
    let kind = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    ApiError::field(key, format!("`{key}` must be {want}, got {kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().expect("object")
    }

    #[test]
    fn null_is_absent_and_types_are_checked() {
        let m = obj(json!({"a": null, "b": "x", "c": 1.5}));
        let f = Fields(&m);
        assert_eq!(f.bool("a").unwrap(), None);
        assert_eq!(f.bool("missing").unwrap(), None);
        let e = f.bool("b").unwrap_err();
        assert!(matches!(&e, ApiError::InvalidField { param, .. } if param == "b"), "{e:?}");
        assert!(f.uint("c", 0, 10).is_err(), "1.5 is no integer");
    }

    #[test]
    fn integers_are_range_checked_before_narrowing() {
        let m = obj(json!({"neg": -1, "big": 1e30, "two": 2.0, "max": u64::MAX, "min": i64::MIN}));
        let f = Fields(&m);
        assert!(f.uint("neg", 1, 100).is_err());
        assert!(f.uint("big", 1, u64::MAX).is_err(), "1e30 does not fit 64 bits");
        assert_eq!(f.uint("two", 1, 100).unwrap(), Some(2));
        assert_eq!(f.int("neg", -1, 5).unwrap(), Some(-1));
        assert!(f.int("max", -1, i64::MAX).is_err());
        assert_eq!(f.seed("max").unwrap(), Some(u64::MAX));
        assert_eq!(f.seed("min").unwrap(), Some(1u64 << 63));
        assert!(f.float("big", 0.0, 2.0).is_err());
    }
}
