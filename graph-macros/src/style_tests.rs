//! Style of the error messages (issue 33): every message the macros emit leads with one line
//! of at most [`MAX_FIRST_LINE`] characters that says what happened; the reason and the fix
//! follow on lines of their own (`= note:`, `= help:`, laid out by [`Message`]).
//!
//! Here the rule table rendered with typical names; `ui-tests/tests/source_style.rs` reads
//! every `Message::new(…)` of the sources and every error line of the compile-fail snapshots.

use crate::check::rule_table;
use crate::ctxt::{Message, MAX_FIRST_LINE};

/// What a placeholder (`{what}`, `{data}`, a `format!` argument) counts as: 20 characters of
/// typical content (`` `.clone_dtoh()` ``, a parameter name).
const PLACEHOLDER: &str = "xxxxxxxxxxxxxxxxxxxx";

fn too_long(line: &str) -> bool {
    line.chars().count() > MAX_FIRST_LINE
}

#[test]
fn every_rule_message_leads_with_one_short_line() {
    let mut offenders = Vec::new();
    for rule in rule_table() {
        let rendered = rule.render(PLACEHOLDER, PLACEHOLDER);
        let text = rendered.to_string();
        let first = text.lines().next().expect("a message has a first line");
        assert_eq!(first, rendered.what(), "rule `{}`: {text}", rule.id);
        if too_long(first) {
            offenders.push(format!(
                "rule `{}` ({} characters): {first}",
                rule.id,
                first.chars().count()
            ));
        }
        // The rest are `= note:` and `= help:` lines, at least one of each.
        let rest: Vec<&str> = text.lines().skip(1).collect();
        assert!(
            rest.iter().any(|l| l.starts_with("= note: ")),
            "rule `{}`: no reason: {text}",
            rule.id
        );
        assert!(
            rest.iter().any(|l| l.starts_with("= help: ")),
            "rule `{}`: no fix: {text}",
            rule.id
        );
        assert!(
            rest.iter()
                .all(|l| l.starts_with("= note: ") || l.starts_with("= help: ")),
            "rule `{}`: {text}",
            rule.id
        );
    }
    assert!(
        offenders.is_empty(),
        "first lines over {MAX_FIRST_LINE} characters:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_first_line_is_the_what() {
    let m = Message::new("what").why("why").fix("fix");
    assert_eq!(m.to_string().lines().next(), Some(m.what()));
}
