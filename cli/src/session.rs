//! What a command session shares: the store built from flags and environment, confirmation
//! prompts, and progress bars that only draw on a terminal.

use std::io::{BufRead, IsTerminal, Write};

use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use sqs_keeper_aws::AwsClients;
use sqs_keeper_aws::{DeadLetterStore, StoreConfig};

use crate::args::GlobalArgs;
use crate::CliError;

/// Returns the AWS configuration for the global options (profile, region, endpoint).
pub async fn sdk_config(global: &GlobalArgs) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(profile) = &global.profile {
        loader = loader.profile_name(profile);
    }
    if let Some(region) = &global.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &global.endpoint_url {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}

/// AWS clients for the global options.
pub async fn clients(global: &GlobalArgs) -> AwsClients {
    AwsClients::from_config(
        &sdk_config(global).await,
        global.endpoint_url.is_some() || sqs_keeper_aws::s3_path_style_from_env(),
    )
}

/// Returns the store named by the global options; a usage error naming what is missing.
///
/// An option not given is read as the functions read it: its variable, else the store's
/// object of variables (`SQS_KEEPER_STORE`).
pub async fn store(global: &GlobalArgs) -> Result<DeadLetterStore, CliError> {
    use sqs_keeper_lambda::config::vars;
    let lookup = |name: &str| std::env::var(name).ok();
    let mut env = sqs_keeper_lambda::config::EnvReader::new(&lookup);
    let given = |option: &Option<String>, var: &vars::Var| option.clone().or_else(|| env.raw(var));
    let table = given(&global.table, &vars::TABLE);
    let queue_url = given(&global.queue_url, &vars::QUEUE_URL);
    let bucket = given(&global.bucket, &vars::BUCKET);
    let mut missing = Vec::new();
    for (value, what) in [
        (&table, "--table / DLQ_TABLE"),
        (&queue_url, "--queue-url / DLQ_QUEUE_URL"),
        (&bucket, "--bucket / DLQ_BUCKET"),
    ] {
        if value.is_none() {
            missing.push(what);
        }
    }
    match (table, queue_url, bucket) {
        (Some(table), Some(queue_url), Some(bucket)) => {
            let mut config = StoreConfig::new(&table, &queue_url, &bucket);
            if let Some(from_env) = sqs_keeper_lambda::config::read_store_config(&mut env) {
                config.inline_max_bytes = from_env.inline_max_bytes;
                config.retention = from_env.retention;
            }
            Ok(DeadLetterStore::new(clients(global).await, config))
        }
        _ => Err(CliError::Usage(format!(
            "the store is not configured: set {}",
            missing.join(", ")
        ))),
    }
}

/// Asks the operator to confirm a destructive action, unless `yes`.
pub fn confirm(question: &str, yes: bool) -> Result<(), CliError> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(format!(
            "{question}: refusing without --yes because stdin is not a terminal"
        )));
    }
    eprint!("{question} Type 'yes' to continue: ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::Usage(format!("cannot read the answer: {e}")))?;
    if answer.trim() == "yes" {
        Ok(())
    } else {
        Err(CliError::Usage("not confirmed; nothing was changed".into()))
    }
}

/// Returns a progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(total: Option<u64>, what: &str) -> ProgressBar {
    let bar = match total {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = if total.is_some() {
        "{msg} [{bar:30}] {pos}/{len} ({rate}, {eta} left)"
    } else {
        "{spinner} {msg} {pos} ({rate})"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        let style = style.progress_chars("=> ").with_key(
            "rate",
            |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&rate(state.per_sec()));
            },
        );
        bar.set_style(style);
    }
    bar.set_message(what.to_string());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

/// Items per second for a person: whole numbers with thousands separators (`1,866/s`),
/// one decimal under ten (`2.5/s`).
pub fn rate(per_sec: f64) -> String {
    if !per_sec.is_finite() || per_sec <= 0.0 {
        return "0/s".to_string();
    }
    if per_sec < 10.0 {
        return format!("{per_sec:.1}/s");
    }
    // Rounded to a whole number first; `as` saturates, and no rate comes near u64::MAX.
    let whole = per_sec.round() as u64;
    let digits = whole.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    format!("{grouped}/s")
}

#[cfg(test)]
mod tests {
    use super::rate;

    #[test]
    fn rates_read_like_a_person_writes_them() {
        assert_eq!(rate(1866.4), "1,866/s");
        assert_eq!(rate(1_234_567.0), "1,234,567/s");
        assert_eq!(rate(999.6), "1,000/s");
        assert_eq!(rate(42.0), "42/s");
        assert_eq!(rate(2.46), "2.5/s");
        assert_eq!(rate(0.0), "0/s");
        assert_eq!(rate(f64::NAN), "0/s");
        assert_eq!(rate(f64::INFINITY), "0/s");
    }
}
