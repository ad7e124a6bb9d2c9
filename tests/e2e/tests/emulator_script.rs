//! `scripts/emulator.sh` owns its processes: `start` detaches (a pipe on its stdout reaches
//! end of file when it exits, so `scripts/emulator.sh start | tail` returns) and records the
//! emulators' own pids; `stop` ends exactly those processes, DynamoDB Local's JVM included,
//! and returns once they have exited and their ports are closed.
//!
//! The test starts a second pair of emulators in a state directory of its own
//! (`EMULATOR_STATE_DIR`), beside the pair the rest of the suite uses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn script() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/emulator.sh").to_string()
}

fn alive(pid: u32) -> bool {
    // `kill -0` asks whether the process exists without signalling it; a zombie is gone
    // for our purpose, so read its state too.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )
    .is_ok()
}

#[test]
fn start_detaches_and_stop_ends_exactly_what_start_started() {
    let state = std::env::temp_dir().join(format!("emulator-script-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let run = |verb: &str| {
        Command::new(script())
            .arg(verb)
            .env("EMULATOR_STATE_DIR", &state)
            .env_remove("EMULATOR_PORT")
            .env_remove("EMULATOR_DYNAMODB_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };

    // `start`, its stdout a pipe: the pipe must reach end of file once the script exits,
    // which it does only if no process it leaves behind holds the pipe's write end.
    let started = Instant::now();
    let mut start = run("start");
    let mut stdout = start.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        tx.send(out).unwrap();
    });
    let status = start.wait().unwrap();
    assert!(status.success(), "start failed: {status}");
    let out = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("start exited but its stdout never reached end of file: something it started holds the caller's pipe");
    assert!(
        out.trim().starts_with("http://127.0.0.1:"),
        "start printed {out:?}"
    );
    eprintln!("started in {:?}", started.elapsed());

    let read = |name: &str| -> u32 {
        std::fs::read_to_string(state.join(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (moto_pid, dynamodb_pid) = (read("moto.pid"), read("dynamodb.pid"));
    let (moto_port, dynamodb_port) = (read("moto.port") as u16, read("dynamodb.port") as u16);
    // The pid files name the emulators themselves, not a shell around them.
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(
        comm(dynamodb_pid).trim(),
        "java",
        "dynamodb.pid is not the JVM"
    );
    assert!(
        std::fs::read_to_string(format!("/proc/{moto_pid}/cmdline"))
            .unwrap()
            .contains("moto_server"),
        "moto.pid is not moto_server"
    );
    assert!(listening(moto_port) && listening(dynamodb_port));

    // `stop` returns once both have exited: nothing listens on their ports afterwards.
    let status = run("stop").wait().unwrap();
    assert!(status.success(), "stop failed: {status}");
    assert!(!alive(moto_pid), "moto still runs after stop");
    assert!(
        !alive(dynamodb_pid),
        "DynamoDB Local's java still runs after stop"
    );
    assert!(
        !listening(moto_port),
        "moto's port still listens after stop"
    );
    assert!(
        !listening(dynamodb_port),
        "DynamoDB Local's port still listens after stop"
    );
    let _ = std::fs::remove_dir_all(&state);
}
