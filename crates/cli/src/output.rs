//! Human-readable tables, or JSON for scripts.

use serde_json::Value;

/// Prints rows as aligned columns under a header.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = widths.get(i).copied().unwrap_or(0)))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// One row per item of a JSON array (none when it is not one).
pub fn rows(list: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    list.as_array()
        .map(|items| items.iter().map(row).collect())
        .unwrap_or_default()
}

/// The named fields of an object, as cells.
pub fn cells(item: &Value, names: &[&str]) -> Vec<String> {
    names.iter().map(|n| text(&item[*n])).collect()
}

/// Prints `key: value` lines for the named fields of an object.
pub fn fields(value: &Value, names: &[&str]) {
    let width = names.iter().map(|n| n.len()).max().unwrap_or(0);
    for name in names {
        let shown = text(&value[*name]);
        if !shown.is_empty() {
            println!("{name:<width$}  {shown}");
        }
    }
}

/// A JSON value as a short cell.
pub fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}
