//! Human-readable tables, or JSON for scripts.

use serde_json::Value;

/// Prints rows as aligned columns under a header, fitted to the terminal's width (see
/// [`width`]): the widest columns give way first, their cells cut with `…`.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    if let Some(limit) = width() {
        fit(&mut widths, limit);
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let width = widths.get(i).copied().unwrap_or(0);
                format!("{:<width$}", cut(c, width))
            })
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// The narrowest a column is cut to.
const MIN_COLUMN: usize = 6;

/// The width to fit tables to: `COLUMNS` when set, else the terminal's when stdout is
/// one; `None` (no limit) when piped, so scripts read whole cells.
pub fn width() -> Option<usize> {
    let columns = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok());
    columns.filter(|c| *c > 0).or_else(|| {
        terminal_size::terminal_size_of(std::io::stdout()).map(|(w, _)| usize::from(w.0))
    })
}

/// Narrows `widths` (two spaces between columns) to `limit` in all, the widest column
/// first, none below [`MIN_COLUMN`]. The first column (an id, to act on) gives way only
/// when every other is at the minimum. A table that cannot fit stays at the minimum.
pub fn fit(widths: &mut [usize], limit: usize) {
    let gaps = 2 * widths.len().saturating_sub(1);
    while widths.iter().sum::<usize>() + gaps > limit {
        let widest = |from: usize| {
            (from..widths.len())
                .filter(|i| widths[*i] > MIN_COLUMN)
                .max_by_key(|i| widths[*i])
        };
        match widest(1).or_else(|| widest(0)) {
            Some(i) => widths[i] -= 1,
            None => return,
        }
    }
}

/// `text` cut to `width` characters, its last one `…` when it was longer.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut kept: String = text.chars().take(width.saturating_sub(1)).collect();
    kept.push('…');
    kept
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

#[cfg(test)]
mod tests {
    use super::{cut, fit};

    #[test]
    fn a_table_too_wide_gives_way_from_its_widest_column() {
        let mut widths = vec![32, 8, 40, 25];
        fit(&mut widths, 80);
        assert_eq!(widths.iter().sum::<usize>() + 6, 80, "{widths:?}");
        assert_eq!(
            widths[0], 32,
            "the id keeps its width while others can give: {widths:?}"
        );
        assert_eq!(widths[1], 8, "a narrow column keeps its width: {widths:?}");
        let mut tight = vec![32, 8, 40, 25];
        fit(&mut tight, 40);
        assert_eq!(tight, [16, 6, 6, 6], "then the id gives way too");
        let mut narrow = vec![32, 32, 32];
        fit(&mut narrow, 10);
        assert_eq!(narrow, [6, 6, 6], "never below the minimum");
        let mut fits = vec![4, 5];
        fit(&mut fits, 80);
        assert_eq!(fits, [4, 5]);
    }

    #[test]
    fn a_cut_cell_ends_with_an_ellipsis_and_keeps_its_width() {
        assert_eq!(cut("6f1c0e0b3f3c4f0e", 8), "6f1c0e0…");
        assert_eq!(cut("héllo", 5), "héllo");
        assert_eq!(cut("héllo wörld", 6).chars().count(), 6);
    }
}
