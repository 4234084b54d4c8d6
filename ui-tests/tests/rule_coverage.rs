//! Every rule of the compile-time check has a pass case that looks like its mistake: correct
//! code of the same shape (a method of your own named like the CUDA call, the legal form of
//! the operation) that must compile. Each file in `tests/pass/` names the rules it stands
//! for on a line `// Look-alikes of: rule-a, rule-b`; this test holds the list to the rule
//! table (`graph-macros/src/check/rules.rs`).

use std::collections::BTreeSet;
use std::path::Path;

/// The ids of the rule table, read from its source (`id: "host-sync",`).
fn rule_ids() -> BTreeSet<String> {
    let table = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graph-macros/src/check/rules.rs");
    let text = std::fs::read_to_string(&table).expect("the rule table");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("id: \""))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// The rules each pass case says it stands for.
fn tagged() -> Vec<(String, Vec<String>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pass");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/pass") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a pass case");
        let ids = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("// Look-alikes of:"))
            .flat_map(|list| list.split(','))
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty())
            .collect();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        out.push((name, ids));
    }
    out
}

#[test]
fn every_rule_has_a_pass_case_that_looks_like_its_mistake() {
    let rules = rule_ids();
    assert!(rules.len() >= 20, "the rule table was not read: {rules:?}");
    let cases = tagged();
    let covered: BTreeSet<&String> = cases.iter().flat_map(|(_, ids)| ids).collect();
    let missing: Vec<&String> = rules.iter().filter(|r| !covered.contains(r)).collect();
    assert!(
        missing.is_empty(),
        "rules without a pass case (tag a case in tests/pass with `// Look-alikes of: …`): {missing:?}"
    );
    let unknown: Vec<(&str, &String)> = cases
        .iter()
        .flat_map(|(file, ids)| ids.iter().map(move |id| (file.as_str(), id)))
        .filter(|(_, id)| !rules.contains(*id))
        .collect();
    assert!(unknown.is_empty(), "tags that name no rule: {unknown:?}");
}
