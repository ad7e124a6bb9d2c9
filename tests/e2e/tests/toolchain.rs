//! The workspace's `rust-version` is the one its dependencies need: the highest any of them
//! declares. A dependency update that raises it fails here until the workspace says so.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use serde_json::Value;

fn version(text: &str) -> Vec<u64> {
    text.split('.').map(|part| part.parse().unwrap()).collect()
}

#[test]
fn rust_version_is_the_highest_a_dependency_declares() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let packages = metadata["packages"].as_array().unwrap();
    let declared = |p: &&Value| p["rust_version"].as_str().map(version);
    let (highest, by) = packages
        .iter()
        .filter(|p| !members.contains(&p["id"].as_str().unwrap()))
        .filter_map(|p| Some((declared(&p)?, p["name"].as_str().unwrap())))
        .max()
        .unwrap();
    for member in packages
        .iter()
        .filter(|p| members.contains(&p["id"].as_str().unwrap()))
    {
        assert_eq!(
            declared(&member),
            Some(highest.clone()),
            "{} declares rust-version {:?}; {by} needs {highest:?}",
            member["name"],
            member["rust_version"]
        );
    }
}
