//! Typed reads of `config.json` keys, each error naming the key (dotted for nested objects,
//! e.g. `rope_scaling.factor`) and the file.
//!
//! A JSON `null` counts as absent except where a caller asks for the raw value (a few keys
//! mean something different when null, e.g. Mistral's `sliding_window`). In lenient mode
//! (used for architectures no family implements) a missing or mistyped key yields the
//! default instead of an error, so such a checkpoint is refused by its architecture name at
//! admission rather than by the first key its config happens to lack.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{CheckpointError, Result};

#[derive(Clone, Copy)]
pub(super) struct Cfg<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
    /// `""` at top level, `"rope_scaling."` inside that object.
    prefix: &'a str,
    lenient: bool,
}

impl<'a> Cfg<'a> {
    pub fn new(path: &'a Path, value: &'a Value, lenient: bool) -> Result<Self> {
        match value {
            Value::Object(obj) => Ok(Cfg { path, obj, prefix: "", lenient }),
            other => Err(CheckpointError::Config {
                path: path.to_path_buf(),
                key: "(top level)".to_string(),
                what: format!("expected a JSON object, found {}", kind(other)),
            }),
        }
    }

    pub fn err(&self, key: &str, what: impl Into<String>) -> CheckpointError {
        CheckpointError::Config {
            path: self.path.to_path_buf(),
            key: format!("{}{key}", self.prefix),
            what: what.into(),
        }
    }

    /// In lenient mode, replaces an error by `default`.
    fn soften<T>(&self, r: Result<T>, default: T) -> Result<T> {
        match r {
            Err(_) if self.lenient => Ok(default),
            r => r,
        }
    }

    /// `Err` naming `key` unless `ok` (never in lenient mode).
    pub fn ensure(&self, ok: bool, key: &str, what: impl FnOnce() -> String) -> Result<()> {
        if ok || self.lenient {
            Ok(())
        } else {
            Err(self.err(key, what()))
        }
    }

    /// The value as written, `null` included.
    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key)
    }

    /// The value, with `null` read as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// A nested object (`prefix` must be `key` followed by a dot), or `None` if absent/null.
    pub fn sub(&self, key: &str, prefix: &'a str) -> Result<Option<Cfg<'a>>> {
        let r = match self.get(key) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Cfg { obj, prefix, ..*self })),
            Some(other) => Err(self.err(key, format!("expected an object, found {}", kind(other)))),
        };
        self.soften(r, None)
    }

    /// A non-negative integer, or `None` if absent/null.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        let r = self.get(key).map(|v| as_usize(v).ok_or_else(|| self.err(key, want_int(v))));
        self.soften(r.transpose(), None)
    }

    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        Ok(self.usize(key)?.unwrap_or(default))
    }

    /// A required positive integer (0 in lenient mode when missing or bad).
    pub fn positive(&self, key: &str) -> Result<usize> {
        let r = match self.usize(key)? {
            None => Err(self.err(key, "is required and missing")),
            Some(0) => Err(self.err(key, "must be positive, found 0")),
            Some(n) => Ok(n),
        };
        self.soften(r, 0)
    }

    /// A finite number, or `None` if absent/null.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        let r = self.get(key).map(|v| match v.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            _ => Err(self.err(key, format!("expected a finite number, found {v}"))),
        });
        self.soften(r.transpose(), None)
    }

    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        Ok(self.f64(key)?.unwrap_or(default))
    }

    /// A required positive finite number.
    pub fn positive_f64(&self, key: &str) -> Result<f64> {
        let r = match self.f64(key)? {
            None => Err(self.err(key, "is required and missing")),
            Some(x) if x > 0.0 => Ok(x),
            Some(x) => Err(self.err(key, format!("must be positive, found {x}"))),
        };
        self.soften(r, 0.0)
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        let r = match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.err(key, format!("expected true or false, found {v}"))),
        };
        self.soften(r, default)
    }

    pub fn str(&self, key: &str) -> Result<Option<&'a str>> {
        let r = match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.err(key, format!("expected a string, found {v}"))),
        };
        self.soften(r, None)
    }

    /// A token id: absent gives `default`; null or a negative id (some configs write -1
    /// for "none") gives `None`.
    pub fn token_id(&self, key: &str, default: Option<u32>) -> Result<Option<u32>> {
        let r = match self.raw(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => self.one_token(key, v),
        };
        self.soften(r, default)
    }

    /// One id or a list of ids (HF `eos_token_id`); absent gives `default`, null none.
    pub fn token_ids(&self, key: &str, default: &[u32]) -> Result<Vec<u32>> {
        let r = match self.raw(key) {
            None => Ok(default.to_vec()),
            Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(|v| self.one_token(key, v).transpose())
                .collect::<Result<Vec<u32>>>(),
            Some(v) => Ok(self.one_token(key, v)?.into_iter().collect()),
        };
        self.soften(r, default.to_vec())
    }

    fn one_token(&self, key: &str, v: &Value) -> Result<Option<u32>> {
        match v.as_i64() {
            Some(id) if id < 0 => Ok(None),
            Some(id) => u32::try_from(id)
                .map(Some)
                .map_err(|_| self.err(key, format!("token id {id} does not fit in 32 bits"))),
            None => Err(self.err(key, format!("expected an integer token id, found {v}"))),
        }
    }
}

fn as_usize(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

fn want_int(v: &Value) -> String {
    format!("expected a non-negative integer, found {v}")
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
