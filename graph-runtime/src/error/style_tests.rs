//! Style of the error messages (issue 33): every message leads with one line of at most 119
//! characters that says what happened; the reason and the fix follow on their own lines.
//!
//! The test reads the crate's sources, takes the string literal of every `thiserror` error
//! attribute, counts each `{…}` placeholder as 20 characters of typical content and measures
//! the literal's first line.

use std::path::{Path, PathBuf};

/// The longest first line a message may have.
const MAX_FIRST_LINE: usize = 119;

/// What a `{…}` placeholder counts as.
const PLACEHOLDER: &str = "xxxxxxxxxxxxxxxxxxxx";

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

/// One message: where its attribute is and its literal, as written.
struct Message {
    file: PathBuf,
    line: usize,
    literal: String,
}

/// The literal of every error attribute in `source`; `transparent` ones have none.
fn messages(file: &Path, source: &str) -> Vec<Message> {
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
        found.push(Message {
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
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
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
