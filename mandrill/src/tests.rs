//! The crate's shape, checked: no import circle passes through a seam.
//!
//! A seam (`broker`, `store`, `restarter`, `safety`, `worker`, `domain`)
//! may be named by the modules above it and may name those below, never
//! both: a circle through one would make the seam's trait depend on an
//! adapter or on the service that wires it. The graph is read from the
//! source: an edge for each `crate::x` a top-level module names outside
//! its tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const SEAMS: [&str; 6] = ["broker", "store", "restarter", "safety", "worker", "domain"];

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Each top-level module and the top-level modules its non-test code names.
fn graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for entry in std::fs::read_dir(src).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let module = name.trim_end_matches(".rs").to_owned();
        if module != "lib" && module != "main" {
            graph.insert(module, BTreeSet::new());
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    let mut files = Vec::new();
    sources(src, &mut files);
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let is_test = relative.components().any(|part| {
            let part = part.as_os_str().to_string_lossy();
            part == "tests"
                || part == "tests.rs"
                || part == "testing.rs"
                || part.contains("contract")
        });
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = top.trim_end_matches(".rs");
        if is_test || !modules.contains(top) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        for named in code.split("crate::").skip(1) {
            let named: String = named
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if named != top && modules.contains(&named) {
                graph.get_mut(top).unwrap().insert(named);
            }
        }
    }
    graph
}

fn sources(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The modules `from` reaches, itself excluded unless a circle leads back.
fn reachable(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut next: Vec<&String> = graph[from].iter().collect();
    while let Some(module) = next.pop() {
        if seen.insert(module.clone()) {
            next.extend(&graph[module]);
        }
    }
    seen
}

/// The circles through a seam, as (seam, a module on the circle).
fn circles_through_seams(graph: &Graph) -> Vec<(&'static str, String)> {
    SEAMS
        .iter()
        .flat_map(|seam| {
            reachable(graph, seam)
                .into_iter()
                .filter(|module| reachable(graph, module).contains(*seam))
                .map(move |module| (*seam, module))
        })
        .collect()
}

#[test]
fn no_import_circle_passes_through_a_seam() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for seam in SEAMS {
        assert!(graph.contains_key(seam), "{seam} is a top-level module");
    }
    let circles = circles_through_seams(&graph);
    assert!(circles.is_empty(), "{circles:?} in {graph:#?}");
}

/// The check sees a circle when there is one: `store` naming `sqlite`,
/// which implements `Store`, is one.
#[test]
fn a_seam_naming_its_adapter_is_a_circle() {
    let mut graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    graph.get_mut("store").unwrap().insert("sqlite".into());
    assert!(circles_through_seams(&graph).contains(&("store", "sqlite".into())));
}
