//! The code's structure, checked: no import cycles between source files, each table
//! written by its owner only, and short functions.
//!
//! Cycles: every path a file names (in `use` items and inline, `crate::`, `super::`,
//! `self::` or a child module's name) is an arrow to the file of the deepest module it
//! reaches. Arrows from a file to a module it is nested in are left out: a child may use
//! what its parent defines, and the parent names its children with `mod`. Any other
//! circle of arrows fails the test, with the names that tie it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's source files, by module path (`[]` is the root).
struct Crate {
    files: BTreeMap<Vec<String>, PathBuf>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file below `src`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("below src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    match last.as_str() {
        "lib.rs" | "main.rs" | "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    parts
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut found = Vec::new();
        rust_files(src, &mut found);
        let mut files = BTreeMap::new();
        for file in found {
            // A binary beside a library is a crate of its own; it only calls the library.
            if file == src.join("main.rs") && src.join("lib.rs").exists() {
                continue;
            }
            files.insert(module_of(src, &file), file);
        }
        Crate { files }
    }

    /// The file of the deepest module `path` reaches, from the module `at`.
    fn resolve(&self, at: &[String], path: &[String]) -> Option<&PathBuf> {
        let mut module: Vec<String> = match path.first()?.as_str() {
            "crate" => Vec::new(),
            "self" => at.to_vec(),
            "super" => {
                let mut m = at.to_vec();
                m.pop()?;
                m
            }
            child => {
                let mut m = at.to_vec();
                m.push(child.to_string());
                if !self.files.contains_key(&m) {
                    return None;
                }
                m.pop();
                m
            }
        };
        let mut rest = &path[usize::from(matches!(path[0].as_str(), "crate" | "self" | "super"))..];
        // `super::super::…`
        while rest.first().is_some_and(|s| s == "super") {
            module.pop()?;
            rest = &rest[1..];
        }
        for segment in rest {
            module.push(segment.clone());
            if !self.files.contains_key(&module) {
                module.pop();
                break;
            }
        }
        self.files.get(&module)
    }
}

/// The code of a Rust file without its comments, strings and character literals (their
/// line breaks kept, so lines still count).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let start = i;
        let (end, stands_for) = match skipped(&chars, i) {
            Some(skip) => skip,
            None => {
                out.push(chars[i]);
                i += 1;
                continue;
            }
        };
        out.push_str(stands_for);
        out.extend(
            chars[start..end.min(chars.len())]
                .iter()
                .filter(|c| **c == '\n'),
        );
        i = end;
    }
    out
}

/// Where a comment, string or character literal that starts at `i` ends, and what
/// stands for it in the code; `None` where none starts.
fn skipped(chars: &[char], i: usize) -> Option<(usize, &'static str)> {
    let c = chars[i];
    let next = chars.get(i + 1).copied();
    if c == '/' && next == Some('/') {
        let mut j = i;
        while j < chars.len() && chars[j] != '\n' {
            j += 1;
        }
        return Some((j, ""));
    }
    if c == '/' && next == Some('*') {
        let (mut j, mut depth) = (i, 0);
        while j < chars.len() {
            if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                depth += 1;
                j += 2;
            } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    break;
                }
            } else {
                j += 1;
            }
        }
        return Some((j, " "));
    }
    if c == 'r' && matches!(next, Some('"') | Some('#')) && !ident_before(chars, i) {
        // A raw string: r"…" or r#"…"#.
        let mut j = i + 1;
        let mut hashes = 0;
        while chars.get(j) == Some(&'#') {
            hashes += 1;
            j += 1;
        }
        if chars.get(j) != Some(&'"') {
            return None;
        }
        j += 1;
        while j < chars.len()
            && !(chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')))
        {
            j += 1;
        }
        return Some((j + 1 + hashes, "\"\""));
    }
    if c == '"' {
        let mut j = i + 1;
        while j < chars.len() && chars[j] != '"' {
            j += if chars[j] == '\\' { 2 } else { 1 };
        }
        return Some((j + 1, "\"\""));
    }
    if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
        // A character literal (a lifetime has no closing quote).
        let mut j = i + 1;
        while j < chars.len() && chars[j] != '\'' {
            j += if chars[j] == '\\' { 2 } else { 1 };
        }
        return Some((j + 1, "' '"));
    }
    None
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// Every path a `use` tree names, in full (`a::{b, c::d}` is `a::b` and `a::c::d`).
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head = &tree[..open];
            let mut base = prefix.to_vec();
            base.extend(segments(head));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut start = 0;
            for (k, ch) in inner.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        } else {
            let name = tree.split(" as ").next().unwrap_or(tree);
            // `a::{self}` names `a` itself.
            let prefixed = !prefix.is_empty();
            let mut path = prefix.to_vec();
            path.extend(
                segments(name)
                    .into_iter()
                    .filter(|s| s != "self" || !prefixed),
            );
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    expand(&[], tree, &mut out);
    out
}

fn segments(text: &str) -> Vec<String> {
    text.split("::")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s != "*")
        .collect()
}

/// Every path the code names: `use` trees, and inline `crate::`, `super::` and `self::`
/// paths.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let word_at = |i: usize, word: &str| {
        code[i..].starts_with(word)
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
    };
    let mut i = 0;
    while i < code.len() {
        if word_at(i, "use ") {
            let end = code[i..].find(';').map_or(code.len(), |e| i + e);
            paths.extend(expand_use(&code[i + 4..end]));
            i = end;
            continue;
        }
        if ["crate::", "super::", "self::"]
            .iter()
            .any(|w| word_at(i, w))
        {
            let end = code[i..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| i + e);
            paths.push(segments(&code[i..end]));
            i = end;
            continue;
        }
        i += code[i..].chars().next().map_or(1, char::len_utf8);
    }
    paths
}

/// The arrows between a crate's files: from each file, to the files it names, with the
/// names.
fn arrows(krate: &Crate) -> BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> {
    let mut out: BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>> = BTreeMap::new();
    for (module, file) in &krate.files {
        let text = std::fs::read_to_string(file).expect("source");
        for path in paths_in(&code_only(&text)) {
            let Some(target) = krate.resolve(module, &path) else {
                continue;
            };
            let target_module = module_of_file(krate, target);
            let nested_in = module.starts_with(&target_module);
            if target == file || nested_in {
                continue;
            }
            out.entry(file.clone())
                .or_default()
                .entry(target.clone())
                .or_default()
                .insert(path.join("::"));
        }
    }
    out
}

fn module_of_file(krate: &Crate, file: &Path) -> Vec<String> {
    krate
        .files
        .iter()
        .find(|(_, f)| f.as_path() == file)
        .map(|(m, _)| m.clone())
        .unwrap_or_default()
}

/// The strongly connected groups of more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        next: usize,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(targets) = s.graph.get(v) {
            for w in targets.keys() {
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[w].min(s.low[v]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.index[w].min(s.low[v]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.push(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                s.found.push(group);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// The source directories of the workspace's crates.
fn sources() -> Vec<PathBuf> {
    let root = root();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates")
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.push(root.join("tests").join("src"));
    dirs.sort();
    dirs
}

#[test]
fn no_file_imports_another_that_imports_it_back() {
    let mut report = Vec::new();
    let mut files = 0;
    for src in sources() {
        let krate = Crate::read(&src);
        files += krate.files.len();
        let graph = arrows(&krate);
        for group in circles(&graph) {
            let mut lines = vec![format!("a circle of {} files:", group.len())];
            for from in &group {
                for (to, names) in &graph[from] {
                    if group.contains(to) {
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        let short =
                            |p: &Path| p.strip_prefix(root()).unwrap_or(p).display().to_string();
                        lines.push(format!(
                            "  {} -> {}: {}",
                            short(from),
                            short(to),
                            names.join(", ")
                        ));
                    }
                }
            }
            report.push(lines.join("\n"));
        }
    }
    assert!(files > 100, "only {files} source files were read");
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// The checker finds what it is for: a circle through `use` trees and inline paths,
/// and none where a child only uses its parent.
#[test]
fn the_checker_sees_a_circle() {
    let dir = std::env::temp_dir().join(format!("cairn-structure-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).expect("dir");
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).expect("write");
    write("lib.rs", "mod a;\npub use a::Thing;\n");
    write("a/mod.rs", "mod b;\nmod c;\npub use b::Thing;\n");
    write(
        "a/b.rs",
        "use super::{c::{self, Other}};\n// crate::a::d\npub struct Thing;\n",
    );
    write(
        "a/c.rs",
        "pub struct Other;\nfn f() { let _ = \"super::b\"; super::b::Thing; }\n",
    );
    let krate = Crate::read(&src);
    let graph = arrows(&krate);
    let found = circles(&graph);
    assert_eq!(found.len(), 1, "{graph:?}");
    assert_eq!(found[0].len(), 2, "{found:?}");
    // Without the inline path, no circle: a string or a comment is no arrow.
    write(
        "a/c.rs",
        "pub struct Other;\nfn f() { let _ = \"super::b\"; }\n",
    );
    let krate = Crate::read(&src);
    assert!(circles(&arrows(&krate)).is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

/// The contents of a Rust file's string literals, each on a line of its own.
fn strings_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        match skipped(&chars, i) {
            Some((end, stands_for)) => {
                if stands_for == "\"\"" {
                    // Without its delimiters: `"` or `r#"` before, `"#` after.
                    let literal = &chars[i..end.min(chars.len())];
                    let hashes = literal.iter().skip(1).take_while(|c| **c == '#').count();
                    let (open, close) = match literal[0] {
                        'r' => (2 + hashes, 1 + hashes),
                        _ => (1, 1),
                    };
                    if literal.len() >= open + close {
                        out.extend(&literal[open..literal.len() - close]);
                    }
                    out.push('\n');
                }
                i = end;
            }
            None => i += 1,
        }
    }
    out
}

/// Each table's one writer, and the files that still write it besides: the renovation
/// (issue 43) moves those into the owner, and this list only shrinks. A file that no
/// longer writes its table must leave the list.
const WRITERS: &[(&str, &str, &[&str])] = &[
    (
        "execution_requests",
        "crates/common/src/request/",
        // The journal charges a step's usage in its own statement (a plan's first
        // intent records the resume context with it); the console bench's bulk load of
        // 100,000 runs in a few statements.
        &[
            "crates/common/src/journal.rs",
            "crates/bench/src/console.rs",
        ],
    ),
    (
        "runs",
        "crates/common/src/request/",
        // The console bench's bulk load.
        &["crates/bench/src/console.rs"],
    ),
    ("continuation_actions", "crates/common/src/request/", &[]),
    ("batch_admissions", "crates/common/src/request/", &[]),
    (
        "reconciliation_decisions",
        "crates/common/src/request/",
        &[],
    ),
    ("journal_intents", "crates/common/src/journal.rs", &[]),
    ("journal_receipts", "crates/common/src/journal.rs", &[]),
    ("journal_entries", "crates/common/src/journal.rs", &[]),
    ("verification_handoffs", "crates/common/src/handoff.rs", &[]),
    (
        "verification_adoptions",
        "crates/common/src/handoff.rs",
        &[],
    ),
    ("verification_results", "crates/common/src/handoff.rs", &[]),
    ("final_reports", "crates/common/src/report.rs", &[]),
    ("report_consumptions", "crates/common/src/report.rs", &[]),
    ("outbox", "crates/common/src/outbox.rs", &[]),
    ("worker_heartbeats", "crates/common/src/heartbeat.rs", &[]),
    ("holds", "crates/common/src/hold.rs", &[]),
    (
        "project_snapshots",
        "crates/common/src/lineage/",
        // The reaper bench's bulk load of 100,000 rows in one statement.
        &["crates/bench/src/reaper.rs"],
    ),
    ("lineage_heads", "crates/common/src/lineage/", &[]),
    ("snapshot_packs", "crates/common/src/lineage/", &[]),
    ("snapshot_chunks", "crates/common/src/lineage/", &[]),
    ("snapshot_restores", "crates/common/src/lineage/", &[]),
    ("credential_generations", "crates/common/src/lineage/", &[]),
    ("workspaces", "crates/common/src/workspace.rs", &[]),
    ("sandboxes", "crates/common/src/sandbox/", &[]),
    ("sandbox_operations", "crates/common/src/sandbox/", &[]),
    ("sandbox_idempotency", "crates/common/src/sandbox/", &[]),
    (
        "sandbox_templates",
        "crates/common/src/sandbox/template.rs",
        &[],
    ),
    ("volumes", "crates/common/src/sandbox/volume.rs", &[]),
    ("recovery_policy", "crates/common/src/policy.rs", &[]),
    ("source_profiles", "crates/common/src/qualification.rs", &[]),
    ("publications", "crates/common/src/publication.rs", &[]),
    ("delivery_holds", "crates/common/src/publication.rs", &[]),
    ("network_policy", "crates/common/src/network_policy.rs", &[]),
    ("tenants", "crates/common/src/tenant.rs", &[]),
    ("api_tokens", "crates/common/src/token.rs", &[]),
    ("sweeps", "crates/common/src/reaper_status.rs", &[]),
    ("overview_samples", "crates/common/src/overview.rs", &[]),
];

/// The tables the migrations create.
fn tables() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let dir = root().join("crates/common/migrations");
    for entry in std::fs::read_dir(dir).expect("migrations").flatten() {
        let text = std::fs::read_to_string(entry.path()).expect("migration");
        for part in text.split("CREATE TABLE ").skip(1) {
            let name: String = part
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

/// The tables a file's SQL writes (`INSERT INTO`, `UPDATE`, `DELETE FROM`), leaving out
/// its unit tests.
fn written_by(text: &str, tables: &BTreeSet<String>) -> BTreeSet<String> {
    let code = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    let sql = strings_of(code);
    let words: Vec<&str> = sql.split_whitespace().collect();
    let mut out = BTreeSet::new();
    for (i, word) in words.iter().enumerate() {
        let target = match *word {
            "INSERT" | "DELETE" if matches!(words.get(i + 1), Some(&"INTO") | Some(&"FROM")) => {
                words.get(i + 2)
            }
            "UPDATE" => words.get(i + 1),
            _ => None,
        };
        if let Some(name) = target {
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if tables.contains(&name) {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn each_table_has_one_writer() {
    let tables = tables();
    assert!(tables.len() >= 25, "{tables:?}");
    let root = root();
    let mut files = Vec::new();
    for src in sources() {
        rust_files(&src, &mut files);
    }
    let mut problems = Vec::new();
    let mut seen: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file
            .strip_prefix(&root)
            .expect("in the workspace")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(file).expect("source");
        for table in written_by(&text, &tables) {
            let Some((name, owner, others)) = WRITERS.iter().find(|(t, _, _)| *t == table) else {
                problems.push(format!(
                    "{table} (written by {relative}) has no owner in WRITERS"
                ));
                continue;
            };
            seen.entry(name).or_default().insert(relative.clone());
            if !relative.starts_with(owner) && !others.contains(&relative.as_str()) {
                problems.push(format!(
                    "{relative} writes {table}: only {owner} may (call its functions)"
                ));
            }
        }
    }
    for (table, _, others) in WRITERS {
        for other in *others {
            if !seen.get(table).is_some_and(|s| s.contains(*other)) {
                problems.push(format!(
                    "{other} no longer writes {table}: take it off WRITERS"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The longest a function may be, in lines, outside tests.
const MAX_FUNCTION_LINES: usize = 80;

/// Each function of a file's code (before its unit tests) and its length in lines.
fn functions_of(text: &str) -> Vec<(String, usize)> {
    let code = code_only(match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    });
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = fn_name(lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut started, mut j) = (0i32, false, i);
        while j < lines.len() {
            for ch in lines[j].chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        started = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (started && depth == 0) || (!started && lines[j].trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        if started {
            found.push((name, j - i + 1));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    found
}

/// The name of the function a line starts, if it starts one.
fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(word) = words.peek() {
        if word.starts_with("pub") || ["async", "unsafe", "const", "extern"].contains(word) {
            words.next();
        } else {
            break;
        }
    }
    if words.next()? != "fn" {
        return None;
    }
    let name: String = words
        .next()?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn functions_are_short() {
    let root = root();
    let mut problems = Vec::new();
    for src in sources() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        // A `tests.rs` is a module of unit tests (`#[cfg(test)] mod tests;`).
        for file in files.into_iter().filter(|f| !f.ends_with("tests.rs")) {
            let relative = file
                .strip_prefix(&root)
                .expect("in the workspace")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&file).expect("source");
            for (name, lines) in functions_of(&text) {
                if lines > MAX_FUNCTION_LINES {
                    problems.push(format!(
                        "{relative}: fn {name} is {lines} lines (at most {MAX_FUNCTION_LINES})"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The tests that take the services lock exclusively, by name: each `fn` whose body
/// calls `ServiceLock::exclusive`.
fn exclusive_tests(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut current = None;
    for line in code_only(text).lines() {
        if let Some(name) = fn_name(line.trim_start()) {
            current = Some(name);
        }
        if line.contains("ServiceLock::exclusive()") {
            names.extend(current.clone());
        }
    }
    names
}

/// Each test that restarts or flushes a shared service is one the test runner runs
/// alone (`.config/nextest.toml`): otherwise it holds a test slot while it waits for
/// the lock, and the rest of the suite runs on fewer.
#[test]
fn tests_that_disrupt_a_service_run_alone() {
    let root = root();
    let config = std::fs::read_to_string(root.join(".config/nextest.toml")).expect("config");
    let alone = config
        .split("[[profile.default.overrides]]")
        .find(|o| o.contains("threads-required = \"num-test-threads\""))
        .expect("an override that runs tests alone");
    let mut files = Vec::new();
    rust_files(&root.join("tests/tests"), &mut files);
    rust_files(&root.join("crates"), &mut files);
    let mut found = 0;
    let mut missing = Vec::new();
    for file in files
        .iter()
        .filter(|f| f.components().any(|c| c.as_os_str() == "tests"))
    {
        let text = std::fs::read_to_string(file).expect("source");
        for name in exclusive_tests(&text) {
            found += 1;
            // The whole name, as the override names it (`test(=module::name)`).
            if !alone.contains(&format!("::{name})")) {
                missing.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(
        found > 0,
        "the scan found no test taking the lock exclusively"
    );
    assert!(
        missing.is_empty(),
        "not run alone by .config/nextest.toml:\n{}",
        missing.join("\n")
    );
}
