//! The crate's layers, each module importing only from the layers below it, and the test that
//! holds the tree to it. From the top:
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 4 | `app`, `config`, `telemetry` | wiring: settings, logging, start and shutdown, commands |
//! | 3 | `http`, `webhooks`, `audit` | the ways in and out: the API, deliveries, the auditor |
//! | 2 | `transfer`, `auth` | the engine (the protocol, its documents and their views); API keys |
//! | 1 | `store` | documents with Elasticsearch's semantics, and the backends |
//! | 0 | `time`, `metrics`, `trace_context` | timestamps; the Prometheus series; W3C trace context |
//!
//! Modules of one layer do not import each other, except at the top, which wires everything.
//!
//! The module map, file by file, is `docs/design.md` §1 ("Module map"); a test here fails when
//! a source file is missing from it.

/// Each top-level module and its layer.
#[cfg(test)]
const LAYERS: &[(&str, u8)] = &[
    ("app", 4),
    ("config", 4),
    ("telemetry", 4),
    ("http", 3),
    ("webhooks", 3),
    ("audit", 3),
    ("transfer", 2),
    ("auth", 2),
    ("store", 1),
    ("time", 0),
    ("metrics", 0),
    ("trace_context", 0),
];

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::LAYERS;

    const TOP: u8 = 4;

    fn layer(module: &str) -> Option<u8> {
        LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
    }

    /// Every `.rs` file under `dir`.
    fn sources(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                files.extend(sources(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
        files
    }

    /// The top-level modules `line` names as `crate::<module>`, comments left out.
    fn named_modules(line: &str) -> Vec<&str> {
        let code = line.split("//").next().unwrap_or("");
        code.match_indices("crate::")
            .map(|(at, prefix)| {
                let rest = &code[at + prefix.len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .filter(|name| !name.is_empty())
            .collect()
    }

    #[test]
    fn every_module_imports_only_from_the_layers_below_it() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut violations = Vec::new();
        for file in sources(&src) {
            let relative = file.strip_prefix(&src).expect("under src");
            let first = relative.iter().next().expect("a name").to_string_lossy();
            let module = first.trim_end_matches(".rs");
            if matches!(module, "lib" | "main" | "layers") {
                continue;
            }
            let Some(own) = layer(module) else {
                violations.push(format!(
                    "src/{module} has no layer in LAYERS (src/layers.rs)"
                ));
                continue;
            };
            let text = std::fs::read_to_string(&file).expect("readable");
            for (number, line) in text.lines().enumerate() {
                for named in named_modules(line) {
                    let Some(theirs) = layer(named) else { continue };
                    if named != module && theirs >= own && own != TOP {
                        violations.push(format!(
                            "{}:{}: {module} (layer {own}) names crate::{named} (layer {theirs})",
                            relative.display(),
                            number + 1
                        ));
                    }
                }
            }
        }
        assert!(
            violations.is_empty(),
            "imports against the layers:\n{}",
            violations.join("\n")
        );
    }

    /// The rows of the module map: each path, and what its row says.
    fn module_map() -> Vec<(String, String)> {
        let design = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/design.md");
        let text = std::fs::read_to_string(design).expect("docs/design.md");
        let map = text
            .split("### Module map")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .expect("docs/design.md has a module map");
        map.lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|row| row.split_once("` | "))
            .map(|(path, what)| (path.to_owned(), what.to_owned()))
            .collect()
    }

    /// Whether the module map names `file` (`src/a/b.rs`): a row of its own, or a row of one
    /// of its directories (`src/a/`) or of its parent module (`src/a.rs`) naming it
    /// (`` `b.rs` ``, `` `b` ``, `` `a/b.rs` ``).
    fn mapped(file: &str, map: &[(String, String)]) -> bool {
        let parts: Vec<&str> = file.split('/').collect();
        map.iter().any(|(path, what)| {
            path == file
                || (1..parts.len()).any(|k| {
                    let below = parts[k..].join("/");
                    let names = [
                        format!("`{below}`"),
                        format!("`{}`", below.trim_end_matches(".rs")),
                    ];
                    let with_parent = format!("`{}`", parts[k - 1..].join("/"));
                    let dir = format!("{}/", parts[..k].join("/"));
                    let parent_file = format!("{}.rs", parts[..k].join("/"));
                    (*path == dir && names.iter().any(|n| what.contains(n.as_str())))
                        || (*path == parent_file && what.contains(&with_parent))
                })
        })
    }

    #[test]
    fn the_module_map_in_the_design_notes_names_every_source_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let map = module_map();
        let missing: Vec<String> = sources(&root.join("src"))
            .into_iter()
            .map(|file| {
                file.strip_prefix(root)
                    .expect("under the root")
                    .display()
                    .to_string()
            })
            // Unit tests live beside their module and are described by it.
            .filter(|file| !file.contains("/tests/") && !file.ends_with("/tests.rs"))
            .filter(|file| !mapped(file, &map))
            .collect();
        assert!(
            missing.is_empty(),
            "source files missing from docs/design.md's module map: {missing:?}"
        );
    }

    #[test]
    fn a_reference_to_a_higher_layer_is_found() {
        assert_eq!(named_modules("use crate::http::events::Event;"), ["http"]);
        assert_eq!(
            named_modules("let x = crate::config::Protocol::Auto; // crate::app"),
            ["config"]
        );
        assert!(named_modules("/// See [`crate::http::router`].").is_empty());
    }
}
