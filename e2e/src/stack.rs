//! Stacks of the project's templates deployed into the emulator's CloudFormation: the
//! template translated offline, created with parameters, and what it made.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers fail loudly

use std::path::PathBuf;
use std::time::Duration;

use aws_sdk_cloudformation::types::{Parameter, StackStatus};
use serde_json::Value;

/// The workspace's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A translated template, `main` (`infra/template.yaml`) or `handler` (`infra/handler.yaml`).
/// Runs `scripts/infra.sh translate`, which installs the tools on first use.
pub fn translated_template(which: &str) -> Value {
    let status = std::process::Command::new(root().join("scripts/infra.sh"))
        .arg("translate")
        .status()
        .unwrap();
    assert!(status.success(), "translating the SAM templates failed");
    let file = if which == "handler" {
        "handler.json"
    } else {
        "template.json"
    };
    serde_json::from_str(&std::fs::read_to_string(root().join("target/infra").join(file)).unwrap())
        .unwrap()
}

/// `text` with `%XX` escapes decoded (IAM returns policy documents URL-encoded).
pub fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A zip file with no entries: enough for the emulator to create a function.
pub const EMPTY_ZIP: &[u8] = &[
    0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// Creates a stack of `template` in the emulator and waits for it; returns its outputs.
pub async fn create_stack(
    cloudformation: &aws_sdk_cloudformation::Client,
    stack: &str,
    template: &Value,
    parameters: &[(&str, &str)],
) -> std::collections::HashMap<String, String> {
    let created = cloudformation
        .create_stack()
        .stack_name(stack)
        .template_body(template.to_string())
        .set_parameters(Some(
            parameters
                .iter()
                .map(|(k, v)| {
                    Parameter::builder()
                        .parameter_key(*k)
                        .parameter_value(*v)
                        .build()
                })
                .collect(),
        ))
        .send()
        .await;
    // A busy emulator can drop the first answer; the SDK's retry then finds the stack.
    if let Err(e) = created {
        let code = aws_sdk_cloudformation::error::ProvideErrorMetadata::code(&e);
        assert_eq!(code, Some("AlreadyExistsException"), "create_stack: {e:?}");
    }
    let mut outputs = std::collections::HashMap::new();
    for _ in 0..120 {
        let described = cloudformation
            .describe_stacks()
            .stack_name(stack)
            .send()
            .await
            .unwrap();
        let s = &described.stacks()[0];
        match s.stack_status() {
            Some(StackStatus::CreateComplete) => {
                for o in s.outputs() {
                    outputs.insert(
                        o.output_key().unwrap().to_string(),
                        o.output_value().unwrap().to_string(),
                    );
                }
                break;
            }
            Some(StackStatus::CreateInProgress) => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            other => panic!("stack ended in {other:?}: {:?}", s.stack_status_reason()),
        }
    }
    outputs
}
