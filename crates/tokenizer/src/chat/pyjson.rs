//! `json.dumps` as Python writes it, for the `tojson` filter of chat templates.
//!
//! transformers replaces Jinja's `tojson` with `json.dumps(x, ensure_ascii=False, indent=...,
//! separators=..., sort_keys=...)`, and templates print tool schemas with it, so the bytes must
//! match Python's: separators `", "` / `": "` by default (`","` between items when indenting),
//! keys in insertion order, no HTML escaping (minijinja's own `tojson` escapes `<>&'`), floats as
//! Python's `repr` (`1e-05`, `1e+16`, `100.0`), `NaN` / `Infinity`, control characters as
//! `\u00XX` with lowercase hex, and with ensure_ascii every non-ASCII character as `\uXXXX`
//! (UTF-16 surrogate pairs above U+FFFF).

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The options of `json.dumps` that `tojson` exposes.
pub(crate) struct Style {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline and `s` repeated per depth level.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl Style {
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
    ) -> Self {
        let (item_sep, key_sep) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        Style { ensure_ascii, indent, item_sep, key_sep, sort_keys: false }
    }
}

fn unsupported(kind: ValueKind) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: a {kind} is not JSON serializable"))
}

pub(crate) fn dumps(value: &Value, style: &Style) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

fn newline(out: &mut String, style: &Style, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value)?,
        ValueKind::String => {
            write_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_seq(out, &items, style, depth)?;
        }
        ValueKind::Map => write_map(out, value, style, depth)?,
        kind => return Err(unsupported(kind)),
    }
    Ok(())
}

fn write_seq(out: &mut String, items: &[Value], style: &Style, depth: usize) -> Result<(), Error> {
    if items.is_empty() {
        out.push_str("[]");
        return Ok(());
    }
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, style, depth + 1);
        write_value(out, item, style, depth + 1)?;
    }
    newline(out, style, depth);
    out.push(']');
    Ok(())
}

/// A key as Python's json writes it: strings as is, numbers, booleans and None as JSON text.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number | ValueKind::Bool | ValueKind::None => {
            let mut s = String::new();
            write_value(&mut s, key, &Style::new(false, None, None), 0)?;
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn write_map(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    let mut entries = Vec::new();
    for key in value.try_iter()? {
        let item = value.get_item(&key)?;
        entries.push((key_text(&key)?, item));
    }
    if style.sort_keys {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
    }
    if entries.is_empty() {
        out.push_str("{}");
        return Ok(());
    }
    out.push('{');
    for (i, (key, item)) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, style, depth + 1);
        write_string(out, key, style.ensure_ascii);
        out.push_str(&style.key_sep);
        write_value(out, item, style, depth + 1)?;
    }
    newline(out, style, depth);
    out.push('}');
    Ok(())
}

fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return Ok(());
    }
    let f = f64::try_from(value.clone())?;
    out.push_str(&float_repr(f));
    Ok(())
}

/// Python's `repr(float)` (also `json.dumps`'s): the shortest round-trip digits, positional for
/// 1e-4 <= |x| < 1e16, otherwise `d.ddde+XX` with a signed exponent of at least two digits.
/// Rust's `{:?}` picks the same digits and the same switch points; only the exponent's
/// spelling differs (`1e16`, `1e-5`).
pub(crate) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let s = format!("{f:?}");
    let Some((mantissa, exp)) = s.split_once('e') else {
        return s;
    };
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

pub(crate) fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_spell_like_python() {
        // Expected strings are Python 3's repr() of the same doubles.
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e-5, "1e-05"),
            (1.5e300, "1.5e+300"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (-0.0, "-0.0"),
            (2.5e-7, "2.5e-07"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn strings_escape_like_python() {
        let mut s = String::new();
        write_string(&mut s, "a\"b\\c\n\u{1}\u{7f}é😀<>&'", false);
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u0001\u{7f}é😀<>&'\"");
        let mut s = String::new();
        write_string(&mut s, "é😀", true);
        assert_eq!(s, "\"\\u00e9\\ud83d\\ude00\"");
    }
}
