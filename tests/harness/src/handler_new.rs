//! `keeper new`: a handler crate of one's own, outside this workspace.
//!
//! The crate depends on this checkout's `sqs-keeper` by path (on crates.io's when the tool
//! was installed and no checkout is at hand), carries the workspace's `Cargo.lock` (so that
//! it builds with the dependency versions `make test` tested instead of resolving afresh),
//! and a release profile that unwinds on panic, and the SAM template that deploys it on the
//! reusable store (`template.yaml` beside a copy of `infra/store.yaml`). The files come
//! from `tests/harness/templates/handler/`, compiled in, with their `{{…}}` names
//! replaced. A template engine is not used: five fixed names in small files need none.

use std::path::{Path, PathBuf};

/// The files of a new handler crate: (path in the crate, template text).
const FILES: [(&str, &str); 6] = [
    (
        "Cargo.toml",
        include_str!("../templates/handler/Cargo.toml.template"),
    ),
    ("src/main.rs", include_str!("../templates/handler/main.rs")),
    ("README.md", include_str!("../templates/handler/README.md")),
    (".gitignore", include_str!("../templates/handler/gitignore")),
    (
        "template.yaml",
        include_str!("../templates/handler/template.yaml"),
    ),
    (
        "store.yaml",
        include_str!("../templates/handler/store.yaml"),
    ),
];

/// The dependency versions the workspace builds and tests with: a copy of its `Cargo.lock`
/// kept in the package, so that an installed `keeper` has it too (a test keeps the two
/// equal).
const TESTED_LOCK: &str = include_str!("../templates/handler/Cargo.lock");

/// The checkout this binary was built from.
const CHECKOUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The Rust version the library needs (the workspace's `rust-version`).
const RUST_VERSION: &str = env!("CARGO_PKG_RUST_VERSION");

/// What `keeper new` makes.
#[derive(Debug, Clone)]
pub struct NewOptions {
    /// The crate's directory; it must not exist or be empty.
    pub dir: PathBuf,
    /// The package (and binary) name; default: the directory's name.
    pub name: Option<String>,
    /// The `sqs-keeper` crate to depend on; default: this checkout's `shared/sqs-keeper`.
    pub sqs_keeper: Option<PathBuf>,
}

/// Where the new crate takes `sqs-keeper` from.
enum Library {
    /// A checkout's `shared/sqs-keeper`, by path.
    Checkout(PathBuf),
    /// crates.io, at this tool's version (a `keeper` installed with `cargo install`).
    Published,
}

impl Library {
    /// The dependency's value in the manifest (a TOML inline table or string).
    fn dependency(&self) -> String {
        match self {
            Library::Checkout(dir) => format!("{{ path = \"{}\" }}", toml_path(dir)),
            Library::Published => format!("\"{}\"", env!("CARGO_PKG_VERSION")),
        }
    }

    /// Where it comes from, for the crate's README.
    fn origin(&self) -> String {
        match self {
            Library::Checkout(dir) => format!("the checkout at {}", dir.display()),
            Library::Published => format!("crates.io, version {}", env!("CARGO_PKG_VERSION")),
        }
    }

    /// Where the handler's documentation is.
    fn handler_docs(&self) -> String {
        match self {
            Library::Checkout(dir) => {
                let docs = dir.join("../../docs/HANDLERS.md");
                docs.canonicalize().unwrap_or(docs).display().to_string()
            }
            Library::Published => "https://docs.rs/sqs-keeper".to_string(),
        }
    }
}

/// Writes the crate and returns its package name.
pub fn create(options: &NewOptions) -> Result<String, String> {
    let name = package_name(options)?;
    let library = library(options.sqs_keeper.as_deref())?;
    refuse_non_empty(&options.dir)?;
    for (path, template) in FILES {
        let text = template
            .replace("{{name}}", &name)
            .replace("{{rust_version}}", RUST_VERSION)
            .replace("{{sqs_keeper_dependency}}", &library.dependency())
            .replace("{{sqs_keeper_origin}}", &library.origin())
            .replace("{{handler_docs}}", &library.handler_docs());
        write(&options.dir.join(path), &text)?;
    }
    write(&options.dir.join("Cargo.lock"), TESTED_LOCK)?;
    Ok(name)
}

fn package_name(options: &NewOptions) -> Result<String, String> {
    let name = match &options.name {
        Some(name) => name.clone(),
        None => options
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("{}: name the crate with --name", options.dir.display()))?,
    };
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(format!(
            "{name:?} is not a package name: a letter, then letters, digits, `-` or `_` (--name sets it)"
        ));
    }
    if CARGO_RESERVED.contains(&name.as_str()) || in_the_lock_at_our_version(&name) {
        return Err(format!(
            "{name:?} cannot name the crate: Cargo keeps it, or this checkout's Cargo.lock has a package of that name (--name sets another)"
        ));
    }
    Ok(name)
}

/// Names Cargo refuses for a binary: its own directories in `target/`.
const CARGO_RESERVED: [&str; 4] = ["build", "deps", "examples", "incremental"];

/// Whether the lock the crate carries has a package of this name at the new crate's version:
/// the two would collide in it (this workspace's own packages are all there).
fn in_the_lock_at_our_version(name: &str) -> bool {
    let entry = format!("name = \"{name}\"\nversion = \"0.1.0\"");
    TESTED_LOCK.contains(&entry)
}

/// The library: the directory given, else the checkout this tool was built from, else
/// (an installed tool, its checkout gone) crates.io.
fn library(given: Option<&Path>) -> Result<Library, String> {
    let dir = match given {
        Some(dir) => dir.to_path_buf(),
        None => {
            let checkout = Path::new(CHECKOUT).join("shared/sqs-keeper");
            if !checkout.join("Cargo.toml").is_file() {
                return Ok(Library::Published);
            }
            checkout
        }
    };
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).map_err(|e| {
        format!(
            "cannot read {}: {e} (pass the sqs-keeper crate with --sqs-keeper)",
            dir.join("Cargo.toml").display()
        )
    })?;
    if !manifest.contains("name = \"sqs-keeper\"") {
        return Err(format!("{} is not the sqs-keeper crate", dir.display()));
    }
    dir.canonicalize()
        .map(Library::Checkout)
        .map_err(|e| format!("{}: {e}", dir.display()))
}

fn refuse_non_empty(dir: &Path) -> Result<(), String> {
    let in_use = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if in_use {
        return Err(format!(
            "{} exists and is not empty: choose a new directory",
            dir.display()
        ));
    }
    Ok(())
}

/// A path as a TOML basic string's contents: a backslash and a quote escaped, a control
/// character as `\uXXXX` (TOML takes neither raw).
fn toml_path(path: &Path) -> String {
    let mut escaped = String::new();
    for c in path.display().to_string().chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            c if c.is_control() => escaped.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => escaped.push(c),
        }
    }
    escaped
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn options(dir: &Path) -> NewOptions {
        NewOptions {
            dir: dir.to_path_buf(),
            name: None,
            sqs_keeper: None,
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("local-new-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_new_crate_unwinds_pins_the_tested_versions_and_names_itself() {
        let dir = scratch("orders-handler");
        let name = create(&options(&dir)).unwrap();
        assert_eq!(name, dir.file_name().unwrap().to_string_lossy());
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{manifest}"
        );
        assert!(manifest.contains("panic = \"unwind\""), "{manifest}");
        assert!(manifest.contains("\n[workspace]\n"), "{manifest}");
        assert!(!manifest.contains("{{"), "{manifest}");
        let library = Path::new(CHECKOUT)
            .join("shared/sqs-keeper")
            .canonicalize()
            .unwrap();
        assert!(
            manifest.contains(&format!("path = \"{}\"", library.display())),
            "{manifest}"
        );
        let lock = std::fs::read_to_string(dir.join("Cargo.lock")).unwrap();
        assert_eq!(lock, TESTED_LOCK);
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(!readme.contains("{{"), "{readme}");
        let template = std::fs::read_to_string(dir.join("template.yaml")).unwrap();
        assert!(
            template.contains(&format!("Binary: {name} }}")),
            "{template}"
        );
        assert!(dir.join("store.yaml").is_file());
        let main = std::fs::read_to_string(dir.join("src/main.rs")).unwrap();
        assert!(
            main.contains("sqs_keeper::run(handler_fn(handle))"),
            "{main}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The README's handler is the `src/main.rs` a new crate gets: the same code, only
    /// formatted by rustfmt and with the file's own doc comment.
    #[test]
    fn the_readme_shows_the_handler_a_crate_gets() {
        let readme = include_str!("../../../README.md");
        let block = readme
            .split("```rust,no_run\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap();
        assert_eq!(
            code_tokens(block),
            code_tokens(include_str!("../templates/handler/main.rs")),
            "README.md's handler differs from tests/harness/templates/handler/main.rs"
        );
    }

    /// `source` without comments, whitespace and trailing commas: what rustfmt cannot change.
    fn code_tokens(source: &str) -> String {
        source
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .flat_map(str::split_whitespace)
            .collect::<Vec<_>>()
            .join("")
            .replace(",)", ")")
            .replace(",}", "}")
    }

    /// The README's "Deploy it" shows the template a crate named `my-handler` gets, whole.
    #[test]
    fn the_readme_shows_the_template_a_crate_gets() {
        let template =
            include_str!("../templates/handler/template.yaml").replace("{{name}}", "my-handler");
        let readme = include_str!("../../../README.md");
        assert!(
            readme.contains(&format!("```yaml\n{template}```")),
            "README.md's template differs from tests/harness/templates/handler/template.yaml"
        );
    }

    #[test]
    fn the_store_a_crate_gets_is_the_one_infra_holds() {
        assert!(
            include_str!("../templates/handler/store.yaml")
                == include_str!("../../../infra/store.yaml"),
            "infra/store.yaml changed: cp infra/store.yaml tests/harness/templates/handler/store.yaml"
        );
    }

    #[test]
    fn the_lock_a_crate_gets_is_the_one_the_workspace_tests_with() {
        assert!(
            TESTED_LOCK == include_str!("../../../Cargo.lock"),
            "the workspace's Cargo.lock changed: cp Cargo.lock tests/harness/templates/handler/Cargo.lock"
        );
    }

    #[test]
    fn an_installed_tool_without_its_checkout_takes_the_published_crate() {
        let published = Library::Published;
        assert_eq!(
            published.dependency(),
            format!("\"{}\"", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(published.handler_docs(), "https://docs.rs/sqs-keeper");
    }

    #[test]
    fn any_checkout_path_makes_a_manifest_toml_reads_back() {
        let strange = Path::new("/tmp/a \"b\\c\nd\u{7f}e\tf");
        let quoted = format!("path = \"{}\"", toml_path(strange));
        let table: HashMap<String, String> = toml_line(&quoted);
        assert_eq!(table["path"], strange.display().to_string());
    }

    /// `key = "value"` read back as a TOML basic string, as Cargo reads it.
    fn toml_line(line: &str) -> HashMap<String, String> {
        let (key, value) = line.split_once(" = ").unwrap();
        let value: String = serde_json::from_str(value).unwrap();
        HashMap::from([(key.to_string(), value)])
    }

    #[test]
    fn a_directory_in_use_or_a_bad_name_is_refused_and_left_alone() {
        let dir = scratch("in-use");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keep.txt"), "mine").unwrap();
        let err = create(&options(&dir)).unwrap_err();
        assert!(err.contains("not empty"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("keep.txt")).unwrap(),
            "mine"
        );
        assert!(!dir.join("Cargo.toml").exists());
        std::fs::remove_dir_all(&dir).unwrap();

        let mut bad = options(&scratch("bad-name"));
        bad.name = Some("1st handler".to_string());
        let err = create(&bad).unwrap_err();
        assert!(err.contains("not a package name"), "{err}");
        for taken in ["deps", "build", "sqs-keeper", "sqs-keeper-core", "worker"] {
            let mut named = options(&scratch("taken"));
            named.name = Some(taken.to_string());
            let err = create(&named).unwrap_err();
            assert!(err.contains("cannot name the crate"), "{taken}: {err}");
        }
        let mut elsewhere = options(&scratch("elsewhere"));
        elsewhere.sqs_keeper = Some(std::env::temp_dir());
        let err = create(&elsewhere).unwrap_err();
        assert!(err.contains("--sqs-keeper"), "{err}");
    }
}
