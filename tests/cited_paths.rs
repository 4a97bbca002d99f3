//! The repository's text names only files that exist: every backticked source path in `src/`,
//! `docs/`, README.md and Cargo.toml (`src/sinks/iceberg/index.rs`, `docs/testing.md`,
//! `scripts/test.sh`, or a `.rs` path relative to its module such as `commit/publish.rs`) names a
//! file or folder of the working tree, and no code cites `DESIGN.md`, which is not in it.
//!
//! Why: files move (the Iceberg sink's top floor, the sources' assemblers) and the comments and
//! docs that point at them are how a newcomer finds the code; a stale path sends them nowhere.
//! The check reads the tree at test time, so it follows moves other changes make.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Folders at the top of the repository: a path starting with one names a file from the root.
const ROOTS: &[&str] = &["src/", "tests/", "docs/", "scripts/", "bench/", "examples/"];

/// Every file and folder under `dir`, as paths relative to the repository root with `/`.
fn walk(dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if let Ok(rel) = path.strip_prefix(ROOT) {
            out.insert(rel.to_string_lossy().replace('\\', "/"));
        }
        if path.is_dir() {
            walk(&path, out);
        }
    }
}

/// The texts checked: everything under `src/` and `docs/`, README.md and Cargo.toml.
fn cited_in() -> Vec<PathBuf> {
    let mut tree = BTreeSet::new();
    for dir in ["src", "docs"] {
        walk(&Path::new(ROOT).join(dir), &mut tree);
    }
    let mut files: Vec<PathBuf> = tree
        .iter()
        .map(|rel| Path::new(ROOT).join(rel))
        .filter(|p| p.is_file())
        .collect();
    files.extend(["README.md", "Cargo.toml"].map(|f| Path::new(ROOT).join(f)));
    files
}

/// The backticked spans of `text` that look like a path into the repository: path characters
/// only, a `/` or a `.rs` name, not absolute, not above the root, no placeholder (`<table>`) or
/// glob.
fn cited_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            (span.contains('/') || span.ends_with(".rs"))
                && !span.starts_with(['/', '.'])
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        })
        .collect()
}

/// Whether `path` names something in the tree: from the root when it starts with a top folder;
/// a `.rs` path relative to a module (or a bare file name) when some file's path ends with it.
/// Other relative paths
/// (`metadata/v1.metadata.json`, `jars/x.jar`) name files of a warehouse or a test bed, not ours.
fn exists(path: &str, tree: &BTreeSet<String>) -> bool {
    if ROOTS.iter().any(|r| path.starts_with(r)) {
        return tree.contains(path.trim_end_matches('/'));
    }
    if path.ends_with(".rs") {
        let tail = format!("/{path}");
        return tree.iter().any(|f| f.ends_with(&tail));
    }
    true
}

#[test]
fn backticked_paths_name_files_that_exist() {
    let mut tree = BTreeSet::new();
    walk(Path::new(ROOT), &mut tree);
    let mut stale = Vec::new();
    let mut checked = 0;
    for file in cited_in() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not text (no such file is cited)
        };
        let rel = file
            .strip_prefix(ROOT)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            for path in cited_paths(line) {
                checked += 1;
                if !exists(path, &tree) {
                    stale.push(format!("{rel}:{}: `{path}`", n + 1));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: is the scan broken?"
    );
    assert!(
        stale.is_empty(),
        "{} backticked paths name nothing in the repository (moved or removed? point them at the \
         file that holds the code or the argument now):\n{}",
        stale.len(),
        stale.join("\n")
    );
}

#[test]
fn code_does_not_cite_design_md() {
    let cites: Vec<String> = cited_in()
        .into_iter()
        .filter(|f| f.starts_with(Path::new(ROOT).join("src")))
        .filter_map(|f| {
            let text = std::fs::read_to_string(&f).ok()?;
            text.contains("DESIGN.md")
                .then(|| f.strip_prefix(ROOT).unwrap_or(&f).display().to_string())
        })
        .collect();
    assert!(
        cites.is_empty(),
        "DESIGN.md is not in the repository; cite the docs/ file that holds the argument instead:\n{}",
        cites.join("\n")
    );
}

#[test]
fn the_scan_finds_what_it_should() {
    let tree: BTreeSet<String> = [
        "src/sinks/iceberg/index.rs",
        "src/sinks/iceberg",
        "docs/a.md",
    ]
    .map(String::from)
    .into();
    let line = "see `src/sinks/iceberg/index.rs`, `iceberg/index.rs`, `docs/a.md`, `src/sinks/iceberg/`, \
                `src/gone.rs`, `gone/x.rs`, `metadata/v1.metadata.json`, `<warehouse>/x.rs`, `/tmp/a.rs`, \
                `../shared/x.md`, `index.rs`, `b.rs`, `cdcd check`";
    let paths = cited_paths(line);
    assert_eq!(
        paths,
        [
            "src/sinks/iceberg/index.rs",
            "iceberg/index.rs",
            "docs/a.md",
            "src/sinks/iceberg/",
            "src/gone.rs",
            "gone/x.rs",
            "metadata/v1.metadata.json",
            "index.rs",
            "b.rs"
        ]
    );
    let missing: Vec<&str> = paths.into_iter().filter(|p| !exists(p, &tree)).collect();
    assert_eq!(missing, ["src/gone.rs", "gone/x.rs", "b.rs"]);
}
