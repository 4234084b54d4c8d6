//! The shape of the two published crates' sources, read as text: every error message leads
//! with one short line (issue 33), no function is longer than [`LIMIT`] lines, and every
//! error of the macros is made from their `Message`. The tests sit here, in a crate that is
//! not published, because they read both crates and `ui-tests`' snapshots; the tests that
//! need a crate's internals (the macros' rule table rendered) stay in that crate.

use std::path::{Path, PathBuf};

/// The longest first line a message may have (`graph_macros::ctxt::MAX_FIRST_LINE`).
const MAX_FIRST_LINE: usize = 119;

/// What a `{…}` placeholder counts as: 20 characters of typical content.
const PLACEHOLDER: &str = "xxxxxxxxxxxxxxxxxxxx";

/// The most lines a function may have, its signature and closing brace included.
const LIMIT: usize = 120;

/// `src/` of the workspace crate `name`.
fn src_of(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

fn too_long(line: &str) -> bool {
    line.chars().count() > MAX_FIRST_LINE
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Every `.rs` file under `src/` of crate `name`, with its path relative to `src/`.
fn sources(name: &str) -> Vec<(String, String)> {
    let src = src_of(name);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(&src)
                .expect("under src")
                .display()
                .to_string();
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            (rel.replace('\\', "/"), text)
        })
        .collect()
}

// --- messages: the literals ------------------------------------------------------------

/// The value of the string literal that starts at `text` (at its `"`, or at `r"`/`r#"` for a
/// raw string), or `None` when `text` does not start with one. Escapes are decoded; a `\` at
/// the end of a line drops the line break and the next line's leading whitespace.
fn string_literal(text: &str) -> Option<String> {
    if let Some(raw) = text.strip_prefix('r') {
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        let body = raw[hashes..].strip_prefix('"')?;
        let end = format!("\"{}", "#".repeat(hashes));
        return body.find(&end).map(|at| body[..at].to_owned());
    }
    let mut chars = text.strip_prefix('"')?.chars().peekable();
    let mut value = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                'r' => value.push('\r'),
                '0' => value.push('\0'),
                '\n' => {
                    while chars.peek().is_some_and(|c| c.is_whitespace()) {
                        chars.next();
                    }
                }
                'u' => {
                    // `\u{…}`: the character itself does not matter for the length.
                    for c in chars.by_ref() {
                        if c == '}' {
                            break;
                        }
                    }
                    value.push('?');
                }
                'x' => {
                    chars.next();
                    chars.next();
                    value.push('?');
                }
                other => value.push(other),
            },
            other => value.push(other),
        }
    }
    None
}

/// `text` as a format string renders it with every placeholder 20 characters long.
fn with_placeholders(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push_str(PLACEHOLDER);
            }
            other => out.push(other),
        }
    }
    out
}

// --- the runtime's error messages ------------------------------------------------------

/// One runtime error message: where its attribute is and its literal, as written.
struct ErrorMessage {
    file: PathBuf,
    line: usize,
    literal: String,
}

/// The literal of every error attribute in `source`; `transparent` ones have none.
fn messages(file: &Path, source: &str) -> Vec<ErrorMessage> {
    let attribute = concat!("#[", "error(");
    let mut found = Vec::new();
    let mut offset = 0;
    for (index, line) in source.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim_start();
        if !trimmed.starts_with(attribute) {
            continue;
        }
        let after = start + (line.len() - trimmed.len()) + attribute.len();
        let rest = source[after..].trim_start();
        if rest.starts_with("transparent") {
            continue;
        }
        let literal = string_literal(rest).unwrap_or_else(|| {
            panic!(
                "{}:{}: an error attribute whose message is not a string literal",
                file.display(),
                index + 1
            )
        });
        found.push(ErrorMessage {
            file: file.to_owned(),
            line: index + 1,
            literal,
        });
    }
    found
}

#[test]
fn the_extraction_reads_continued_literals_and_placeholders() {
    let source = concat!(
        "    #[",
        "error(transparent)]\n",
        "    #[",
        "error(\n        \"a `{graph}` b \\\n         c {{d}}\\nsecond {}\",\n        .x\n    )]\n",
        "    #[",
        "error(\"one \\\"quoted\\\" {0:?}\")]\n",
    );
    let found = messages(Path::new("x.rs"), source);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].line, 2);
    assert_eq!(found[0].literal, "a `{graph}` b c {{d}}\nsecond {}");
    assert_eq!(
        with_placeholders(&found[0].literal),
        format!("a `{PLACEHOLDER}` b c {{d}}\nsecond {PLACEHOLDER}")
    );
    assert_eq!(found[1].line, 7);
    assert_eq!(found[1].literal, "one \"quoted\" {0:?}");
}

#[test]
fn every_error_message_leads_with_one_short_line() {
    let root = src_of("graph-runtime");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut all = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        all.extend(messages(file, &source));
    }
    assert!(
        all.len() > 50,
        "found only {} error messages under {}",
        all.len(),
        root.display()
    );
    let offenders: Vec<String> = all
        .iter()
        .filter_map(|message| {
            let rendered = with_placeholders(&message.literal);
            let first = rendered.split('\n').next().unwrap_or_default();
            let length = first.chars().count();
            (length > MAX_FIRST_LINE).then(|| {
                format!(
                    "{}:{}: first line of {length} characters: {first}",
                    message
                        .file
                        .strip_prefix(&root)
                        .unwrap_or(&message.file)
                        .display(),
                    message.line
                )
            })
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "{} error message(s) lead with a line longer than {MAX_FIRST_LINE} characters (a \
         placeholder counts as {}); put a line break (`\\n`) after the part that says what \
         happened, and the reason and the fix on the following line(s):\n{}",
        offenders.len(),
        PLACEHOLDER.len(),
        offenders.join("\n")
    );
}

// --- the macros' messages ----------------------------------------------------------------

/// Every `Message::new(…)` of the macro crate's sources whose first line is a literal (or a
/// `format!` of one), as `(where, first line rendered)`; and the places whose argument is
/// something else.
fn constructors() -> (Vec<(String, String)>, Vec<String>) {
    let mut found = Vec::new();
    let mut computed = Vec::new();
    for (rel, text) in sources("graph-macros") {
        if rel == "style_tests.rs" {
            continue;
        }
        for (at, _) in text.match_indices("Message::new(") {
            let line = text[..at].lines().count().max(1);
            let place = format!("{rel}:{line}");
            let mut arg = text[at + "Message::new(".len()..].trim_start();
            let formatted = arg.starts_with("format!(");
            if formatted {
                arg = arg["format!(".len()..].trim_start();
            }
            match string_literal(arg) {
                Some(value) if formatted => found.push((place, with_placeholders(&value))),
                Some(value) => found.push((place, value)),
                None => computed.push(place),
            }
        }
    }
    (found, computed)
}

#[test]
fn every_message_constructor_leads_with_one_short_line() {
    let (found, computed) = constructors();
    assert!(
        found.len() >= 80,
        "only {} `Message::new` found: was the scan broken?",
        found.len()
    );
    let offenders: Vec<String> = found
        .iter()
        .filter(|(_, first)| too_long(first) || first.contains('\n'))
        .map(|(place, first)| format!("{place} ({} characters): {first}", first.chars().count()))
        .collect();
    assert!(
        offenders.is_empty(),
        "first lines over {MAX_FIRST_LINE} characters (placeholders as {} characters), or with a \
         line break:\n{}",
        PLACEHOLDER.len(),
        offenders.join("\n")
    );
    // A first line that is not written out is the rule table's (checked above).
    assert!(
        computed
            .iter()
            .all(|place| place.starts_with("check/rules.rs:")),
        "`Message::new` with a first line this test cannot read: {computed:?}"
    );
}

/// Every error the macro crate reports is made from its `Message`: the collector takes nothing
/// else, and the errors made outside it (`meta.error(…)`, `syn::Error::new(…)`) are given
/// one.
#[test]
fn every_error_is_made_from_a_message() {
    let mut offenders = Vec::new();
    for (rel, text) in sources("graph-macros") {
        if rel.ends_with("tests.rs") || rel == "check/generated.rs" {
            continue;
        }
        for call in ["meta.error(", "syn::Error::new(", "Error::new_spanned("] {
            for (at, _) in text.match_indices(call) {
                let arg = &text[at + call.len()..];
                // `marked_skip` (derive.rs) only asks whether the attribute parses: its
                // error is never reported.
                if arg.starts_with("\"\")") {
                    continue;
                }
                let window: String = arg.chars().take(160).collect();
                if !window.to_lowercase().contains("message") {
                    let line = text[..at].lines().count();
                    offenders.push(format!("{rel}:{line}: {call}{window}"));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "errors not made from a `Message`:\n{}",
        offenders.join("\n")
    );
}

/// The first line of every error in the compile-fail snapshots, as rustc prints the
/// message: after `error: `, or after `error[E0080]: evaluation panicked: ` for the
/// constant that refuses host-only `&mut` state (`check::state_guards`). Trait and borrow
/// errors (`error[E0277]`, `error[E0505]`, …) are rustc's own, with the runtime's
/// `#[diagnostic::on_unimplemented]` messages; they are not the macros'.
#[test]
fn every_ui_error_line_is_short() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fail");
    // With the cases that need `nccl`, beside them.
    let nccl = dir.with_file_name("fail-nccl");
    let mut snapshots: Vec<PathBuf> = [&dir, &nccl]
        .into_iter()
        .flat_map(|d| std::fs::read_dir(d).expect("ui-tests/tests/fail and fail-nccl exist"))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "stderr"))
        .collect();
    snapshots.sort();
    assert!(!snapshots.is_empty(), "no snapshots in {}", dir.display());
    let mut offenders = Vec::new();
    let mut seen = 0;
    for path in &snapshots {
        let text = std::fs::read_to_string(path).expect("a readable snapshot");
        for (i, line) in text.lines().enumerate() {
            let message = line
                .strip_prefix("error: ")
                .or_else(|| line.strip_prefix("error[E0080]: evaluation panicked: "));
            let Some(message) = message else { continue };
            seen += 1;
            if too_long(message) {
                offenders.push(format!(
                    "{}:{} ({} characters): {line}",
                    path.file_name().expect("a file").to_string_lossy(),
                    i + 1,
                    message.chars().count()
                ));
            }
        }
    }
    assert!(seen > 0, "no `error:` line in {}", dir.display());
    assert!(
        offenders.is_empty(),
        "{} error lines whose message is over {MAX_FIRST_LINE} characters:\n{}",
        offenders.len(),
        offenders.join("\n")
    );
}

// --- function length -------------------------------------------------------------------

/// The name of the function a line declares, if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
        "extern \"C\" ",
    ] {
        while let Some(r) = rest.strip_prefix(prefix) {
            rest = r;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// Every function of `text` over `limit` lines: (name, first line, length).
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        // A declaration without a body (a trait's) ends with `;` before any `{`.
        let body = lines[i..]
            .iter()
            .position(|l| l.trim_end().ends_with('{') || l.trim_end().ends_with(';'));
        if body.is_some_and(|k| lines[i + k].trim_end().ends_with(';')) {
            continue;
        }
        if let Some(k) = lines[i..].iter().position(|l| l.trim_end() == close) {
            if k + 1 > limit {
                out.push((name.to_owned(), i + 1, k + 1));
            }
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut over = Vec::new();
    for krate in ["graph-runtime", "graph-macros"] {
        let files = sources(krate);
        let least = if krate == "graph-runtime" { 20 } else { 10 };
        assert!(files.len() > least, "the sources of {krate} were not found");
        for (rel, text) in files {
            for (name, line, len) in long_functions(&text, LIMIT) {
                over.push(format!("{krate}/src/{rel}:{line} `{name}`: {len} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {LIMIT} lines (split them into functions with one job each):\n{}",
        over.join("\n")
    );
}

#[test]
fn the_measure_finds_a_long_function_and_skips_declarations() {
    let body: String = (0..130).map(|i| format!("    let x{i} = {i};\n")).collect();
    let text = format!(
        "trait T {{\n    fn declared(&self);\n}}\n\npub(crate) fn long() {{\n{body}}}\n\nfn short() {{\n}}\n"
    );
    let found = long_functions(&text, LIMIT);
    assert_eq!(found, vec![("long".to_owned(), 5, 132)]);
}
