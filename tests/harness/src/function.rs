//! Spawns a function binary against a [`crate::runtime_api::RuntimeApi`], with the
//! environment Lambda would give it.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

/// A running function process; killed when dropped.
#[derive(Debug)]
pub struct FunctionProcess {
    child: Child,
}

/// Where cargo put the workspace's binaries for the current profile (`target/debug` or
/// `target/release`), found from the running executable.
pub fn workspace_bin_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?.to_path_buf();
    // Test binaries live one level down, in `deps/`.
    if dir.ends_with("deps") {
        dir.pop();
    }
    Some(dir)
}

/// The variable `make test` sets to the directory `scripts/lambda.sh shipped` builds into
/// (`target/lambda`): the compiled-binary tests then run the `bootstrap`s cargo-lambda built
/// with the release profile, exactly as they are deployed, not the binaries of the test
/// build (another profile, and features unified with the whole workspace).
pub const SHIPPED_BIN_DIR: &str = "SHIPPED_BIN_DIR";

/// The binaries `scripts/lambda.sh shipped` packages.
pub const SHIPPED: [&str; 4] = ["worker", "redrive", "orders-worker", "fixture-handler"];

/// The packaged `bootstrap` of `binary` when [`SHIPPED_BIN_DIR`] is set and it is one of
/// [`SHIPPED`]; `None` otherwise (the caller then uses the test build's binary).
///
/// # Errors
/// The variable is set but the bootstrap is missing: a test must never fall back silently
/// to another build than the one it was asked to check.
pub fn shipped_binary(binary: &str) -> Result<Option<PathBuf>, String> {
    let Some(dir) = std::env::var_os(SHIPPED_BIN_DIR) else {
        return Ok(None);
    };
    if dir.is_empty() {
        return Err(format!(
            "{SHIPPED_BIN_DIR} is set but empty: point it at scripts/lambda.sh shipped's output (target/lambda) or unset it"
        ));
    }
    if !SHIPPED.contains(&binary) {
        return Ok(None);
    }
    let path = PathBuf::from(dir).join(binary).join("bootstrap");
    if path.is_file() {
        Ok(Some(path))
    } else {
        Err(format!(
            "{SHIPPED_BIN_DIR} is set but {} does not exist: run scripts/lambda.sh shipped",
            path.display()
        ))
    }
}

/// The binary a compiled-binary test runs: the packaged one ([`shipped_binary`]) when
/// `make test` asks for it, else `built` (the test build's, e.g. `CARGO_BIN_EXE_worker`).
///
/// # Panics
/// When [`shipped_binary`] fails (a test helper: the test must fail loudly).
#[allow(clippy::panic)]
pub fn binary_under_test(binary: &str, built: &Path) -> PathBuf {
    match shipped_binary(binary) {
        Ok(Some(path)) => path,
        Ok(None) => built.to_path_buf(),
        Err(e) => panic!("{e}"),
    }
}

impl FunctionProcess {
    /// Starts `binary` polling `runtime_api`, with the Lambda variables and `env`.
    /// `log_file`, when given, receives the function's stdout and stderr.
    pub fn spawn(
        binary: &Path,
        function_name: &str,
        runtime_api: &str,
        env: &[(String, String)],
        log_file: Option<&Path>,
    ) -> std::io::Result<FunctionProcess> {
        Self::spawn_command(
            Command::new(binary),
            function_name,
            runtime_api,
            env,
            log_file,
        )
    }

    /// [`FunctionProcess::spawn`] of any command (a runtime interface client and its
    /// handler, say), with the same environment.
    pub fn spawn_command(
        command: Command,
        function_name: &str,
        runtime_api: &str,
        env: &[(String, String)],
        log_file: Option<&Path>,
    ) -> std::io::Result<FunctionProcess> {
        let output = match log_file {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                (Stdio::from(file.try_clone()?), Stdio::from(file))
            }
            None => (Stdio::null(), Stdio::inherit()),
        };
        Self::launch(command, function_name, runtime_api, env, output)
    }

    /// Starts `command` as a function with the Lambda variables, `env`, and its stdout and
    /// stderr going to `output`.
    fn launch(
        mut command: Command,
        function_name: &str,
        runtime_api: &str,
        env: &[(String, String)],
        (stdout, stderr): (Stdio, Stdio),
    ) -> std::io::Result<FunctionProcess> {
        command
            .env("AWS_LAMBDA_RUNTIME_API", runtime_api)
            .env("AWS_LAMBDA_FUNCTION_NAME", function_name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env(
                "AWS_LAMBDA_LOG_GROUP_NAME",
                format!("/aws/lambda/{function_name}"),
            )
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "local/[$LATEST]0")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        Ok(FunctionProcess {
            child: command.spawn()?,
        })
    }

    /// [`FunctionProcess::spawn`] with the function's output on this process's stderr (both
    /// its stdout, where Lambda functions log, and its stderr): a developer watching a
    /// keeper run sees the handler's lines, and this process's stdout stays its own.
    pub fn spawn_to_terminal(
        binary: &Path,
        function_name: &str,
        runtime_api: &str,
        env: &[(String, String)],
    ) -> std::io::Result<FunctionProcess> {
        use std::os::fd::AsFd;
        let stderr = std::io::stderr().as_fd().try_clone_to_owned()?;
        Self::launch(
            without_other_endpoints(Command::new(binary), env),
            function_name,
            runtime_api,
            env,
            (Stdio::from(stderr), Stdio::inherit()),
        )
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the process has exited (and its status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub async fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill().await
    }
}

/// `command` without the variables of this shell that could point the function away from
/// the endpoints and credentials `env` gives it, when `env` gives an endpoint: every `AWS_ENDPOINT_URL*` that `env` does
/// not set (a per-service one wins over the general one), a session token and a profile.
fn without_other_endpoints(mut command: Command, env: &[(String, String)]) -> Command {
    let given = |name: &str| env.iter().any(|(k, _)| k == name);
    // Only over endpoints of the caller's: without them (`keeper invoke`) the shell's own
    // endpoints are the ones to use.
    if !given("AWS_ENDPOINT_URL") {
        return command;
    }
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let elsewhere = name.starts_with("AWS_ENDPOINT_URL")
            || name == "AWS_SESSION_TOKEN"
            || name == "AWS_SECURITY_TOKEN"
            || name == "AWS_PROFILE";
        if elsewhere && !given(&name) {
            command.env_remove(name.as_ref());
        }
    }
    command
}
