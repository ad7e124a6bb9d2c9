//! The infrastructure template: translated offline, checked as JSON (alarms, event source,
//! IAM, variable names), and deployed into the emulator with CloudFormation to check the
//! resources it really creates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use aws_sdk_cloudformation::types::{Parameter, StackStatus};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The translated template (runs `scripts/infra.sh translate`, which installs the tools
/// on first use).
fn translated() -> Value {
    let status = std::process::Command::new(root().join("scripts/infra.sh"))
        .arg("translate")
        .status()
        .unwrap();
    assert!(status.success(), "translating the SAM template failed");
    serde_json::from_str(
        &std::fs::read_to_string(root().join("target/infra/template.json")).unwrap(),
    )
    .unwrap()
}

fn resources_of_type<'a>(template: &'a Value, kind: &str) -> Vec<(&'a String, &'a Value)> {
    template["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .collect()
}

/// A policy document's statements, conditional ones (`Fn::If`) in each of their forms.
fn statements(document: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for statement in document["Statement"].as_array().unwrap() {
        match statement.get("Fn::If") {
            Some(branches) => all.extend(
                branches.as_array().unwrap()[1..]
                    .iter()
                    .filter(|b| b.get("Ref") != Some(&Value::from("AWS::NoValue"))),
            ),
            None => all.push(statement),
        }
    }
    all
}

/// The statement with this `Sid` in a role's inline policy, and the condition it is under.
fn statement<'a>(role: &'a Value, sid: &str) -> (&'a Value, Option<&'a str>) {
    for statement in role["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
        .as_array()
        .unwrap()
    {
        if statement["Sid"] == sid {
            return (statement, None);
        }
        if let Some(branches) = statement.get("Fn::If") {
            if branches[1]["Sid"] == sid {
                return (&branches[1], branches[0].as_str());
            }
        }
    }
    panic!("no statement {sid}")
}

fn env_names(function: &Value) -> BTreeSet<String> {
    function["Properties"]["Environment"]["Variables"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

#[test]
fn variable_names_match_the_code() {
    let template = translated();
    let worker = &template["Resources"]["WorkerFunction"];
    let redrive = &template["Resources"]["RedriveFunction"];
    let worker_code: BTreeSet<String> = sqs_worker::config::WorkerConfig::documented_variables()
        .keys()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(env_names(worker), worker_code, "worker variables drifted");
    let mut redrive_code = worker_code.clone();
    redrive_code.extend(
        sqs_worker::redrive_function::REDRIVE_ENV_VARS
            .iter()
            .map(|(k, _)| k.to_string()),
    );
    assert_eq!(
        env_names(redrive),
        redrive_code,
        "redrive variables drifted"
    );
}

#[test]
fn event_source_alarms_and_iam_as_declared() {
    let template = translated();
    let mappings = resources_of_type(&template, "AWS::Lambda::EventSourceMapping");
    assert_eq!(mappings.len(), 1);
    let esm = &mappings[0].1["Properties"];
    assert_eq!(
        esm["FunctionResponseTypes"],
        serde_json::json!(["ReportBatchItemFailures"])
    );
    assert_eq!(
        esm["ScalingConfig"]["MaximumConcurrency"],
        serde_json::json!({"Ref": "MaximumConcurrency"})
    );
    assert_eq!(esm["BatchSize"], serde_json::json!({"Ref": "BatchSize"}));

    // Visibility timeout is 6 x the function timeout for every allowed timeout.
    let allowed = template["Parameters"]["WorkerTimeoutSeconds"]["AllowedValues"]
        .as_array()
        .unwrap();
    for timeout in allowed {
        let t: u64 = timeout.as_str().unwrap().parse().unwrap();
        let row = &template["Mappings"]["Timeouts"][t.to_string()];
        assert_eq!(row["Function"].as_u64(), Some(t));
        assert_eq!(
            row["Visibility"].as_u64(),
            Some(6 * t),
            "visibility for timeout {t}"
        );
    }

    let alarms = resources_of_type(&template, "AWS::CloudWatch::Alarm");
    let find = |namespace: &str, metric: &str| {
        alarms
            .iter()
            .find(|(_, a)| {
                a["Properties"]["Namespace"] == namespace && a["Properties"]["MetricName"] == metric
            })
            .map(|(name, a)| (name.as_str(), &a["Properties"]))
    };
    let (_, depth) =
        find("AWS/SQS", "ApproximateNumberOfMessagesVisible").expect("DLQ depth alarm");
    assert_eq!(depth["Threshold"], 0);
    assert_eq!(depth["ComparisonOperator"], "GreaterThanThreshold");
    assert_eq!(
        depth["Dimensions"][0]["Value"],
        serde_json::json!({"Fn::GetAtt": ["DeadLetterQueue", "QueueName"]})
    );
    let ages: Vec<_> = alarms
        .iter()
        .filter(|(_, a)| a["Properties"]["MetricName"] == "ApproximateAgeOfOldestMessage")
        .map(|(_, a)| {
            a["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        BTreeSet::from_iter(ages),
        BTreeSet::from(["DeadLetterQueue".to_string(), "SourceQueue".to_string()])
    );
    for metric in ["Errors", "Throttles"] {
        let (_, a) = find("AWS/Lambda", metric).unwrap_or_else(|| panic!("{metric} alarm"));
        assert_eq!(
            a["Dimensions"][0]["Value"],
            serde_json::json!({"Ref": "WorkerFunction"})
        );
    }
    for metric in ["DeadLettered", "DeadLetterFailed"] {
        let (_, a) = find(sqs_worker::metrics::NAMESPACE, metric)
            .unwrap_or_else(|| panic!("{metric} alarm"));
        assert_eq!(a["Statistic"], "Sum");
    }
    for (name, alarm) in &alarms {
        assert!(
            alarm["Properties"]["AlarmActions"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "{name} has no action"
        );
    }
    assert_eq!(
        resources_of_type(&template, "AWS::CloudWatch::Dashboard").len(),
        1
    );

    let table = &template["Resources"]["DeadLetterTable"]["Properties"];
    assert_eq!(
        table["TimeToLiveSpecification"]["AttributeName"],
        sqs_worker::store::schema::EXPIRES_AT
    );
    assert_eq!(table["TimeToLiveSpecification"]["Enabled"], true);
    assert_eq!(
        table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"],
        true
    );
    assert_eq!(table["SSESpecification"]["SSEEnabled"], true);

    let bucket = &template["Resources"]["PayloadBucket"]["Properties"];
    for flag in [
        "BlockPublicAcls",
        "BlockPublicPolicy",
        "IgnorePublicAcls",
        "RestrictPublicBuckets",
    ] {
        assert_eq!(
            bucket["PublicAccessBlockConfiguration"][flag], true,
            "{flag}"
        );
    }
    assert_eq!(
        bucket["LifecycleConfiguration"]["Rules"][0]["ExpirationInDays"],
        serde_json::json!({"Ref": "RetentionDays"}),
        "payloads expire with their records"
    );
    let tls = &template["Resources"]["PayloadBucketPolicy"]["Properties"]["PolicyDocument"]
        ["Statement"][0];
    assert_eq!(tls["Effect"], "Deny");
    assert_eq!(tls["Condition"]["Bool"]["aws:SecureTransport"], "false");

    // The DLQ accepts redrives only from the source queue.
    let allow = &template["Resources"]["DeadLetterQueue"]["Properties"]["RedriveAllowPolicy"];
    assert_eq!(allow["redrivePermission"], "byQueue");
    assert!(
        allow["sourceQueueArns"][0]
            .to_string()
            .contains("${AWS::StackName}-source"),
        "{allow}"
    );

    // Least privilege: no wildcard actions; wildcard resources only for X-Ray.
    for (name, role) in resources_of_type(&template, "AWS::IAM::Role") {
        for policy in role["Properties"]["Policies"].as_array().unwrap() {
            for statement in statements(&policy["PolicyDocument"]) {
                let actions: Vec<&str> = statement["Action"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap())
                    .collect();
                assert!(
                    actions.iter().all(|a| !a.contains('*')),
                    "{name}: wildcard action in {actions:?}"
                );
                if statement["Resource"] == "*" {
                    assert!(
                        actions.iter().all(|a| a.starts_with("xray:")),
                        "{name}: * resource for {actions:?}"
                    );
                }
            }
        }
        assert!(
            role["Properties"].get("ManagedPolicyArns").is_none(),
            "{name} uses managed policies"
        );
    }

    // The downstream credential: both functions may read that one secret, and only when
    // one is configured; the parameters go together.
    for role in ["WorkerRole", "RedriveRole"] {
        let (secret, condition) = statement(&template["Resources"][role], "DownstreamCredential");
        assert_eq!(condition, Some("HasDownstreamAuth"), "{role}");
        assert_eq!(
            secret["Action"],
            serde_json::json!(["secretsmanager:GetSecretValue"])
        );
        assert_eq!(
            secret["Resource"],
            serde_json::json!({"Ref": "DownstreamAuthSecretArn"}),
            "{role}"
        );
    }
    assert_eq!(
        template["Conditions"]["HasDownstreamAuth"],
        serde_json::json!({"Fn::Not": [{"Fn::Equals": [{"Ref": "DownstreamAuthSecretArn"}, ""]}]})
    );
    for function in ["WorkerFunction", "RedriveFunction"] {
        let vars = &template["Resources"][function]["Properties"]["Environment"]["Variables"];
        assert_eq!(
            vars["WORKER_DOWNSTREAM_AUTH_HEADER"],
            serde_json::json!({"Ref": "DownstreamAuthHeader"})
        );
        assert_eq!(
            vars["WORKER_DOWNSTREAM_AUTH_SECRET"],
            serde_json::json!({"Ref": "DownstreamAuthSecretArn"})
        );
    }
    assert!(
        template["Rules"]["DownstreamAuthTogether"].is_object(),
        "header and secret are checked together"
    );
    for parameter in ["DownstreamAuthHeader", "DownstreamAuthSecretArn"] {
        assert_eq!(
            template["Parameters"][parameter]["Default"], "",
            "{parameter}"
        );
    }

    // Extended Client payloads: the worker reads and lists its own bucket and the
    // producers' (a missing object is then a 404, not_found, rather than a 403), within
    // the size cap; the variables come from the parameters.
    let worker_role = &template["Resources"]["WorkerRole"];
    let (list, condition) = statement(worker_role, "ListPayloads");
    assert_eq!(condition, None);
    assert_eq!(list["Action"], serde_json::json!(["s3:ListBucket"]));
    assert_eq!(
        list["Resource"],
        serde_json::json!({"Fn::GetAtt": ["PayloadBucket", "Arn"]})
    );
    for (sid, action, suffix) in [
        ("ProducerPayloads", "s3:GetObject", "/*"),
        ("ListProducerPayloads", "s3:ListBucket", ""),
    ] {
        let (producer, condition) = statement(worker_role, sid);
        assert_eq!(condition, Some("HasPayloadBuckets"), "{sid}");
        assert_eq!(producer["Action"], serde_json::json!([action]), "{sid}");
        let resource = producer["Resource"].to_string();
        assert!(resource.contains("PayloadBuckets"), "{sid}: {resource}");
        assert!(
            resource.contains("arn:${AWS::Partition}:s3:::${"),
            "{sid}: {resource}"
        );
        assert!(
            resource.contains(&format!("{suffix},arn:aws:s3:::")),
            "{sid}: {resource}"
        );
    }
    let (list, _) = statement(&template["Resources"]["RedriveRole"], "ListPayloads");
    assert_eq!(list["Action"], serde_json::json!(["s3:ListBucket"]));
    assert_eq!(
        template["Parameters"]["PayloadBuckets"]["Type"],
        "CommaDelimitedList"
    );
    assert_eq!(template["Parameters"]["PayloadBuckets"]["Default"], "");
    assert_eq!(
        template["Parameters"]["PayloadMaxBytes"]["Default"],
        33_554_432
    );
    let worker_vars =
        &template["Resources"]["WorkerFunction"]["Properties"]["Environment"]["Variables"];
    assert_eq!(
        worker_vars["WORKER_PAYLOAD_BUCKETS"],
        serde_json::json!({"Fn::Join": [",", {"Ref": "PayloadBuckets"}]})
    );
    assert_eq!(
        worker_vars["WORKER_PAYLOAD_MAX_BYTES"],
        serde_json::json!({"Fn::Sub": "${PayloadMaxBytes}"})
    );
}

/// A zip file with no entries: enough for the emulator to create a function.
const EMPTY_ZIP: &[u8] = &[
    0x50, 0x4b, 0x05, 0x06, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploys_into_the_emulator() {
    let mut template = translated();
    // The emulator would invoke the function on every send through a mapping, and does not
    // evaluate alarms (checked on the JSON above): deploy without them.
    let resources = template["Resources"].as_object_mut().unwrap();
    resources.retain(|_, r| {
        !matches!(
            r["Type"].as_str(),
            Some(
                "AWS::Lambda::EventSourceMapping"
                    | "AWS::CloudWatch::Alarm"
                    | "AWS::CloudWatch::Dashboard"
            )
        )
    });
    template.as_object_mut().unwrap().remove("Rules");

    let clients = e2e::clients().await;
    let shared =
        sqs_worker::aws::AwsClients::endpoint_config(&e2e::emulator_url().await, e2e::REGION).await;
    let cloudformation = aws_sdk_cloudformation::Client::new(&shared);
    let lambda = aws_sdk_lambda::Client::new(&shared);
    // The translated template points at the code where `sam package` would put it.
    let artifacts = "sam-artifacts-placeholder";
    let _ = clients.s3.create_bucket().bucket(artifacts).send().await;
    for key in ["WorkerFunction.zip", "RedriveFunction.zip"] {
        clients
            .s3
            .put_object()
            .bucket(artifacts)
            .key(key)
            .body(EMPTY_ZIP.to_vec().into())
            .send()
            .await
            .unwrap();
    }
    let stack = e2e::unique_prefix("stack");
    let created = cloudformation
        .create_stack()
        .stack_name(&stack)
        .template_body(template.to_string())
        .parameters(
            Parameter::builder()
                .parameter_key("DownstreamUrl")
                .parameter_value("https://downstream.example.com/ingest")
                .build(),
        )
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
            .stack_name(&stack)
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
    for key in [
        "SourceQueueUrl",
        "DeadLetterQueueUrl",
        "DeadLetterTableName",
        "PayloadBucketName",
        "WorkerFunctionName",
        "RedriveFunctionName",
    ] {
        assert!(
            outputs.contains_key(key),
            "output {key} missing: {outputs:?}"
        );
    }

    use aws_sdk_sqs::types::QueueAttributeName as Q;
    let source = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&outputs["SourceQueueUrl"])
        .attribute_names(Q::All)
        .send()
        .await
        .unwrap();
    let source = source.attributes().unwrap();
    let redrive: Value = serde_json::from_str(&source[&Q::RedrivePolicy]).unwrap();
    assert_eq!(
        redrive["maxReceiveCount"].to_string().trim_matches('"'),
        "5"
    );
    assert_eq!(
        redrive["deadLetterTargetArn"],
        outputs["DeadLetterQueueArn"]
    );
    assert_eq!(
        source[&Q::VisibilityTimeout],
        "180",
        "6 x the 30 s default timeout"
    );
    let dlq = clients
        .sqs
        .get_queue_attributes()
        .queue_url(&outputs["DeadLetterQueueUrl"])
        .attribute_names(Q::All)
        .send()
        .await
        .unwrap();
    let dlq = dlq.attributes().unwrap();
    let retention = |a: &std::collections::HashMap<Q, String>| {
        a[&Q::MessageRetentionPeriod].parse::<u64>().unwrap()
    };
    assert!(
        retention(dlq) > retention(source),
        "DLQ keeps messages longer than the source"
    );
    // (moto 5.2.5 does not keep RedriveAllowPolicy from CloudFormation; checked on the JSON.)

    let table = clients
        .dynamodb
        .describe_table()
        .table_name(&outputs["DeadLetterTableName"])
        .send()
        .await
        .unwrap();
    let table = table.table().unwrap();
    let mut indexes: Vec<(String, Vec<String>)> = table
        .global_secondary_indexes()
        .iter()
        .map(|i| {
            (
                i.index_name().unwrap().to_string(),
                i.key_schema()
                    .iter()
                    .map(|k| k.attribute_name().to_string())
                    .collect(),
            )
        })
        .collect();
    indexes.sort();
    assert_eq!(
        indexes,
        [
            (
                "by-signature".to_string(),
                vec!["error_signature".to_string(), "last_attempt".to_string()]
            ),
            (
                "by-status".to_string(),
                vec!["status".to_string(), "last_attempt".to_string()]
            ),
        ]
    );
    assert_eq!(
        table.key_schema()[0].attribute_name(),
        sqs_worker::store::schema::ITEM_ID
    );
    // (moto 5.2.5 ignores TimeToLiveSpecification in CloudFormation; checked on the JSON.)
    assert_eq!(
        table.billing_mode_summary().and_then(|b| b.billing_mode()),
        Some(&aws_sdk_dynamodb::types::BillingMode::PayPerRequest)
    );

    // (moto 5.2.5 ignores the bucket's public access block in CloudFormation; checked on
    // the JSON.)
    clients
        .s3
        .head_bucket()
        .bucket(&outputs["PayloadBucketName"])
        .send()
        .await
        .unwrap();

    let worker = lambda
        .get_function_configuration()
        .function_name(&outputs["WorkerFunctionName"])
        .send()
        .await
        .unwrap();
    let vars = worker.environment().unwrap().variables().unwrap();
    let names: BTreeSet<String> = vars.keys().cloned().collect();
    let code: BTreeSet<String> = sqs_worker::config::WorkerConfig::documented_variables()
        .keys()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(names, code);
    assert_eq!(vars["DLQ_TABLE"], outputs["DeadLetterTableName"]);
    assert_eq!(vars["DLQ_QUEUE_URL"], outputs["DeadLetterQueueUrl"]);
    assert_eq!(vars["WORKER_MAX_RECEIVE_COUNT"], "5");
    // The deployed values pass the worker's own validation.
    let config = sqs_worker::config::WorkerConfig::from_lookup(&|k| vars.get(k).cloned()).unwrap();
    assert_eq!(config.batch.max_receive_count, Some(5));
    assert_eq!(config.store.unwrap().table, outputs["DeadLetterTableName"]);
    assert_eq!(worker.timeout(), Some(30));
    assert_eq!(worker.handler(), Some("bootstrap"));

    let redrive_fn = lambda
        .get_function_configuration()
        .function_name(&outputs["RedriveFunctionName"])
        .send()
        .await
        .unwrap();
    let vars = redrive_fn.environment().unwrap().variables().unwrap();
    assert_eq!(vars["REDRIVE_SOURCE_QUEUE_URL"], outputs["SourceQueueUrl"]);
    assert_eq!(redrive_fn.timeout(), Some(900));
}
