//! `local new`: a handler crate of one's own, outside this workspace.
//!
//! The crate depends on this checkout's `sqs-keeper` by path, carries the checkout's
//! `Cargo.lock` (so that it builds with the dependency versions `make test` tested instead
//! of resolving afresh), and a release profile that unwinds on panic. The files come from
//! `tests/harness/templates/handler/`, compiled in, with their `{{…}}` names replaced.
//! A template engine is not used: four fixed names in four small files need none.

use std::path::{Path, PathBuf};

/// The files of a new handler crate: (path in the crate, template text).
const FILES: [(&str, &str); 4] = [
    (
        "Cargo.toml",
        include_str!("../templates/handler/Cargo.toml.template"),
    ),
    ("src/main.rs", include_str!("../templates/handler/main.rs")),
    ("README.md", include_str!("../templates/handler/README.md")),
    (".gitignore", include_str!("../templates/handler/gitignore")),
];

/// The dependency versions this checkout builds and tests with.
const CHECKOUT_LOCK: &str = include_str!("../../../Cargo.lock");

/// The checkout this binary was built from.
const CHECKOUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The Rust version the library needs (the workspace's `rust-version`).
const RUST_VERSION: &str = env!("CARGO_PKG_RUST_VERSION");

/// What `local new` makes.
#[derive(Debug, Clone)]
pub struct NewOptions {
    /// The crate's directory; it must not exist or be empty.
    pub dir: PathBuf,
    /// The package (and binary) name; default: the directory's name.
    pub name: Option<String>,
    /// The `sqs-keeper` crate to depend on; default: this checkout's `shared/sqs-keeper`.
    pub sqs_keeper: Option<PathBuf>,
}

/// Writes the crate and returns its package name.
pub fn create(options: &NewOptions) -> Result<String, String> {
    let name = package_name(options)?;
    let library = library_dir(options.sqs_keeper.as_deref())?;
    refuse_non_empty(&options.dir)?;
    let docs = library.join("../../docs");
    let docs = docs.canonicalize().unwrap_or(docs);
    let fill = |text: &str| {
        text.replace("{{name}}", &name)
            .replace("{{rust_version}}", RUST_VERSION)
            .replace("{{sqs_keeper}}", &toml_path(&library))
            .replace("{{sqs_keeper_docs}}", &docs.display().to_string())
    };
    for (path, template) in FILES {
        write(&options.dir.join(path), &fill(template))?;
    }
    write(&options.dir.join("Cargo.lock"), CHECKOUT_LOCK)?;
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
    if valid {
        Ok(name)
    } else {
        Err(format!(
            "{name:?} is not a package name: a letter, then letters, digits, `-` or `_` (--name sets it)"
        ))
    }
}

/// The library crate's directory, absolute, checked to be `sqs-keeper`.
fn library_dir(given: Option<&Path>) -> Result<PathBuf, String> {
    let dir = match given {
        Some(dir) => dir.to_path_buf(),
        None => Path::new(CHECKOUT).join("shared/sqs-keeper"),
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

/// A path as a TOML basic string's contents.
fn toml_path(path: &Path) -> String {
    path.display()
        .to_string()
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
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
        assert_eq!(lock, CHECKOUT_LOCK);
        let main = std::fs::read_to_string(dir.join("src/main.rs")).unwrap();
        assert!(
            main.contains("sqs_keeper::run(handler_fn(handle))"),
            "{main}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
        let mut elsewhere = options(&scratch("elsewhere"));
        elsewhere.sqs_keeper = Some(std::env::temp_dir());
        let err = create(&elsewhere).unwrap_err();
        assert!(err.contains("--sqs-keeper"), "{err}");
    }
}
