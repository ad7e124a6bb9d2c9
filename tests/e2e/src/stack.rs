//! Stacks of the project's templates deployed into the emulator's CloudFormation: the
//! template translated offline, created with parameters, and what it made.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers fail loudly

use std::path::PathBuf;
use std::time::Duration;

use std::collections::HashMap;

use aws_sdk_cloudformation::types::{Parameter, StackStatus};
use serde_json::Value;
use sqs_keeper_aws::{AwsClients, Endpoints};

/// The workspace's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A translated template: `main` (`infra/template.yaml`), `main-store` (`infra/store.yaml`,
/// as the main template nests it), `handler` (`infra/handler.yaml`, the orders example on
/// the reusable store), `store` (`infra/store.yaml`, as the handler nests it), `scaffold`
/// (the template `keeper new` writes, for a crate `my-handler`) or `cdk` (the CDK
/// construct's orders app, synthesised with bundling skipped).
/// Runs `scripts/infra.sh translate` once per test process, which installs the tools on
/// first use.
/// Tests run in parallel; translating once keeps one test from reading a file another is
/// writing.
pub fn translated_template(which: &str) -> Value {
    static TRANSLATED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut translated = TRANSLATED.lock().unwrap_or_else(|e| e.into_inner());
    if !*translated {
        let status = std::process::Command::new(root().join("scripts/infra.sh"))
            .arg("translate")
            .status()
            .unwrap();
        assert!(status.success(), "translating the SAM templates failed");
        *translated = true;
    }
    let file = match which {
        "main-store" => "template.json.Store.json",
        "handler" => "handler.json",
        "store" => "handler.json.Store.json",
        "scaffold" => "scaffold.json",
        "cdk" => "cdk/Orders.template.json",
        _ => "template.json",
    };
    serde_json::from_str(&std::fs::read_to_string(root().join("target/infra").join(file)).unwrap())
        .unwrap()
}

/// `text` with `%XX` escapes decoded (IAM returns policy documents URL-encoded).
pub use sqs_keeper_local::fault_proxy::percent_decoded;

/// The policy documents of the role `name`: its inline policies and the managed policies of
/// the account attached to it (the reusable store's). The AWS managed policies SAM attaches
/// (basic execution, X-Ray, the SQS poller's) are left out, so that every call must be
/// allowed by a policy the templates write.
pub async fn role_policies(iam: &aws_sdk_iam::Client, name: &str) -> Vec<String> {
    let mut documents = Vec::new();
    let inline = iam
        .list_role_policies()
        .role_name(name)
        .send()
        .await
        .unwrap();
    for policy in inline.policy_names() {
        let output = iam
            .get_role_policy()
            .role_name(name)
            .policy_name(policy)
            .send()
            .await
            .unwrap();
        documents.push(percent_decoded(output.policy_document()));
    }
    for arn in attached_policy_arns(iam, name)
        .await
        .iter()
        .filter(|arn| !arn.contains(":aws:policy/"))
    {
        let policy = iam.get_policy().policy_arn(arn).send().await.unwrap();
        let version = policy
            .policy()
            .and_then(|p| p.default_version_id())
            .unwrap();
        let output = iam
            .get_policy_version()
            .policy_arn(arn)
            .version_id(version)
            .send()
            .await
            .unwrap();
        let document = output.policy_version().and_then(|v| v.document()).unwrap();
        documents.push(percent_decoded(document));
    }
    documents
}

/// The ARNs of the managed policies attached to the role `name`.
pub async fn attached_policy_arns(iam: &aws_sdk_iam::Client, name: &str) -> Vec<String> {
    let attached = iam
        .list_attached_role_policies()
        .role_name(name)
        .send()
        .await
        .unwrap();
    attached
        .attached_policies()
        .iter()
        .filter_map(|p| p.policy_arn().map(str::to_string))
        .collect()
}

/// A zip file with no entries: enough for the emulator to create a function.
pub const EMPTY_ZIP: &[u8] = &[
    0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// `template` as the emulator can deploy it: event source mappings replaced by stand-ins
/// whose `Ref` is a UUID-like id, as a mapping's is (the emulator would invoke the function
/// on every send; the local event source mapping polls instead), without alarms and
/// dashboards (it evaluates no alarm; they are checked on the JSON) and rules (parameter
/// assertions, checked on the JSON).
///
/// A `RetainExceptOnCreate` deletion policy becomes `Retain`. The emulator deletes such a
/// resource with its stack, where CloudFormation keeps it once the stack's creation has
/// succeeded. The deployed stacks are created whole, so `Retain` is what AWS would do.
pub fn deployable(mut template: Value) -> Value {
    if let Some(resources) = template["Resources"].as_object_mut() {
        resources.retain(|_, r| {
            !matches!(
                r["Type"].as_str(),
                Some("AWS::CloudWatch::Alarm" | "AWS::CloudWatch::Dashboard")
            )
        });
        for resource in resources.values_mut() {
            if resource["DeletionPolicy"] == "RetainExceptOnCreate" {
                resource["DeletionPolicy"] = "Retain".into();
            }
            if resource["Type"] == "AWS::Lambda::EventSourceMapping" {
                let uuid = format!(
                    "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                    fastrand::u32(..),
                    fastrand::u16(..),
                    fastrand::u16(..0x1000),
                    fastrand::u16(..0x1000),
                    fastrand::u64(..1 << 48)
                );
                *resource = serde_json::json!({
                    "Type": "AWS::SSM::Parameter",
                    "Properties": {"Name": uuid, "Type": "String", "Value": "event source mapping"}
                });
            }
        }
    }
    if let Some(top) = template.as_object_mut() {
        top.remove("Rules");
    }
    template
}

/// The bucket the translated templates name for code and nested templates, as `sam package`
/// would name its own.
pub const ARTIFACTS: &str = "sam-artifacts-placeholder";

/// Puts what `template` needs in the emulator's S3 before it is created: an empty zip for
/// each function, and each nested stack's template (written beside the translated template
/// by `scripts/infra.sh translate`), deployable as [`deployable`] makes it.
pub async fn upload_artifacts(s3: &aws_sdk_s3::Client, template: &Value) {
    let _ = s3.create_bucket().bucket(ARTIFACTS).send().await;
    let resources = template["Resources"].as_object().unwrap();
    for (name, resource) in resources {
        let (key, body) = match resource["Type"].as_str() {
            Some("AWS::Lambda::Function") => (format!("{name}.zip"), EMPTY_ZIP.to_vec()),
            Some("AWS::CloudFormation::Stack") => {
                let url = resource["Properties"]["TemplateURL"].as_str().unwrap();
                let key = url.rsplit('/').next().unwrap().to_string();
                let nested: Value = serde_json::from_str(
                    &std::fs::read_to_string(root().join("target/infra").join(&key)).unwrap(),
                )
                .unwrap();
                (key, deployable(nested).to_string().into_bytes())
            }
            _ => continue,
        };
        s3.put_object()
            .bucket(ARTIFACTS)
            .key(key)
            .body(body.into())
            .send()
            .await
            .unwrap();
    }
}

/// The physical ids of a stack's resources by logical id, those of its nested stacks
/// included (a nested stack's logical ids are told apart by nothing: the templates keep
/// them distinct).
pub async fn physical_resources(
    cloudformation: &aws_sdk_cloudformation::Client,
    stack: &str,
) -> HashMap<String, String> {
    let mut physical = HashMap::new();
    let mut stacks = vec![stack.to_string()];
    while let Some(stack) = stacks.pop() {
        let resources = cloudformation
            .describe_stack_resources()
            .stack_name(&stack)
            .send()
            .await
            .unwrap();
        for r in resources.stack_resources() {
            let id = r.physical_resource_id().unwrap_or_default().to_string();
            if r.resource_type() == Some("AWS::CloudFormation::Stack") {
                stacks.push(id.clone());
            }
            physical.insert(r.logical_resource_id().unwrap().to_string(), id);
        }
    }
    physical
}

/// Creates a stack of `template` in the emulator and waits for it; returns its outputs.
pub async fn create_stack(
    cloudformation: &aws_sdk_cloudformation::Client,
    stack: &str,
    template: &Value,
    parameters: &[(&str, &str)],
) -> HashMap<String, String> {
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
    let mut outputs = HashMap::new();
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

/// A stack deployed into the emulator, and the clients that reach what it made.
pub struct Deployment {
    /// The project's clients of the emulator's SQS, DynamoDB and S3.
    pub clients: AwsClients,
    /// The emulator's configuration, for the clients of other services.
    pub shared: aws_config::SdkConfig,
    /// The emulator's CloudFormation.
    pub cloudformation: aws_sdk_cloudformation::Client,
    /// The stack's name.
    pub stack: String,
    /// The stack's outputs, by key.
    pub outputs: HashMap<String, String>,
    /// The physical ids of its resources and its nested stacks' ([`physical_resources`]).
    pub physical: HashMap<String, String>,
}

/// Deploys `template` into the emulator at `moto` as a stack named from `prefix`, with
/// `parameters`: made [`deployable`], its artifacts uploaded, created and waited for.
pub async fn deploy(
    moto: &Endpoints,
    prefix: &str,
    template: Value,
    parameters: &[(&str, &str)],
) -> Deployment {
    let template = deployable(template);
    let clients = AwsClients::for_endpoints(moto, crate::REGION).await;
    let shared = AwsClients::endpoint_config(moto, crate::REGION).await;
    let cloudformation = aws_sdk_cloudformation::Client::new(&shared);
    upload_artifacts(&clients.s3, &template).await;
    let stack = crate::unique_prefix(prefix);
    let outputs = create_stack(&cloudformation, &stack, &template, parameters).await;
    let physical = physical_resources(&cloudformation, &stack).await;
    Deployment {
        clients,
        shared,
        cloudformation,
        stack,
        outputs,
        physical,
    }
}
