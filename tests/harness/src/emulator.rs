//! Finding the local AWS emulators: `EMULATOR_URL` (moto: SQS, S3 and the rest) and
//! `EMULATOR_DYNAMODB_URL` (AWS's DynamoDB Local) when set, else `scripts/emulator.sh start`
//! (installs them on first use, a no-op when they run) and the URLs it reports.

use sqs_keeper_aws::Endpoints;

/// The emulators' endpoints, starting them when `EMULATOR_URL` is not set. Without
/// `EMULATOR_DYNAMODB_URL`, DynamoDB is expected at `EMULATOR_URL` too (an emulator that
/// serves every service).
pub fn endpoints_or_start() -> Result<Endpoints, String> {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(shared) = var("EMULATOR_URL") {
        let dynamodb = var("EMULATOR_DYNAMODB_URL").unwrap_or_else(|| shared.clone());
        return Ok(Endpoints { shared, dynamodb });
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/emulator.sh");
    let run = |verb: &str| -> Result<String, String> {
        let output = std::process::Command::new(script)
            .arg(verb)
            .output()
            .map_err(|e| format!("cannot run {script}: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "{script} {verb} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let shared = run("start")?;
    let dynamodb = run("dynamodb-url")?;
    Ok(Endpoints { shared, dynamodb })
}
