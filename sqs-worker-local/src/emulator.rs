//! Finding the local AWS emulator: `EMULATOR_URL` when set, else `scripts/emulator.sh start`
//! (installs it on first use, a no-op when it is running) and the URL it prints.

/// The emulator's URL, starting it when `EMULATOR_URL` is not set.
pub fn url_or_start() -> Result<String, String> {
    if let Ok(url) = std::env::var("EMULATOR_URL") {
        if !url.trim().is_empty() {
            return Ok(url.trim().to_string());
        }
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/emulator.sh");
    let output = std::process::Command::new(script)
        .arg("start")
        .output()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "emulator did not start: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}
