/**
 * A queue worker of one's own for CDK: the sqs-keeper store and a Rust handler consuming it.
 *
 * The store is `infra/store.yaml`, included as it is (`CfnInclude`), so SAM and CDK deploy
 * the same queues, tables, bucket, alarms, dashboard and managed policy. The handler is a
 * `RustFunction` of cargo-lambda-cdk, built by `cargo lambda build`. It attaches the store's
 * `HandlerPolicy`, takes the store's variables whole (`SQS_KEEPER_STORE`), and reports
 * partial batch failures to its event source.
 *
 * @example
 * const worker = new QueueWorker(stack, 'Orders', {
 *   manifestPath: 'Cargo.toml',
 *   binaryName: 'orders-handler',
 *   storeParameters: { ItemIdSource: 'pointer:/order_id', EnableIdempotency: 'true' },
 * });
 * table.grantWriteData(worker.function);
 */
import * as path from 'node:path';
import { CfnParameter, Duration, Stack, Validations } from 'aws-cdk-lib';
import * as iam from 'aws-cdk-lib/aws-iam';
import * as lambda from 'aws-cdk-lib/aws-lambda';
import { SqsEventSource } from 'aws-cdk-lib/aws-lambda-event-sources';
import * as logs from 'aws-cdk-lib/aws-logs';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import * as include from 'aws-cdk-lib/cloudformation-include';
import { RustFunction } from 'cargo-lambda-cdk';
import { Construct } from 'constructs';

/** The store this checkout ships: infra/store.yaml, from dist/lib. */
export const STORE_TEMPLATE = path.join(__dirname, '..', '..', '..', 'store.yaml');

/** What a queue worker is made of. */
export interface QueueWorkerProps {
  /** The handler crate's `Cargo.toml`. */
  readonly manifestPath: string;
  /** The handler's binary (a `[[bin]]` of the crate). */
  readonly binaryName: string;
  /**
   * The function's name. The store names its queues, log group, alarms and dashboard after
   * it. Default: the stack's name and `-handler`.
   */
  readonly functionName?: string;
  /**
   * The function's timeout, one of the store's `TimeoutSeconds`: 10, 15, 30, 60, 120, 300,
   * 600 or 900 seconds. The store sets the source queue's visibility timeout from it.
   * Default: 30 seconds.
   */
  readonly timeout?: Duration;
  /** The store's other parameters (infra/store.yaml), by name. Default: the store's defaults. */
  readonly storeParameters?: Record<string, string>;
  /** The handler's own variables, beside the store's. */
  readonly environment?: Record<string, string>;
  /** The event source's maximum concurrency (2 to 1000). Default: 10. */
  readonly maxConcurrency?: number;
  /** The function's memory in MiB. Default: 256. */
  readonly memorySize?: number;
  /** The store's template. Default: {@link STORE_TEMPLATE}. */
  readonly storeTemplate?: string;
}

/** A Rust handler on its sqs-keeper store. */
export class QueueWorker extends Construct {
  /** The store, as included: its resources by logical id (`getResource('SourceQueue')`). */
  readonly store: include.CfnInclude;
  /** The handler's function. */
  readonly function: RustFunction;

  constructor(scope: Construct, id: string, props: QueueWorkerProps) {
    super(scope, id);
    const functionName = props.functionName ?? `${Stack.of(this).stackName}-handler`;
    const timeout = props.timeout ?? Duration.seconds(30);
    const stack = Stack.of(this);
    const others = stack.node.findAll().filter((c) => c instanceof QueueWorker && c !== this);
    if (others.length > 0) {
      throw new Error(
        `${this.node.path}: a stack holds one QueueWorker, since the store keeps its logical ids; ` +
          `give each worker a stack of its own (a NestedStack works), beside ${others[0].node.path}`,
      );
    }
    this.store = new include.CfnInclude(this, 'Store', {
      templateFile: props.storeTemplate ?? STORE_TEMPLATE,
    });
    // Each value given becomes its parameter's default, checked against the parameter's
    // constraints here: a parameter replaced in place would lose them, and a value such as
    // a quote would then break the store's Environment output.
    const given: Record<string, string> = {
      ...props.storeParameters,
      FunctionName: functionName,
      TimeoutSeconds: String(timeout.toSeconds()),
    };
    for (const [name, value] of Object.entries(given)) {
      const parameter = this.store.getParameter(name);
      const problem = refusal(parameter, value);
      if (problem !== undefined) {
        throw new Error(`${this.node.path}: store parameter ${name} = ${JSON.stringify(value)} ${problem}`);
      }
      parameter.default = value;
    }
    // The two the function fixes take no other value.
    this.store.getParameter('FunctionName').allowedValues = [functionName];
    this.store.getParameter('TimeoutSeconds').allowedValues = [given.TimeoutSeconds];
    // The store's alarms choose a topic under a condition (Fn::If), which the
    // synthesis-time validator does not follow: it warns of an empty topic. cfn-lint checks
    // the store whole.
    Validations.of(this.store).acknowledge({
      id: 'CloudFormation-Validate::W1030',
      reason: 'an empty topic is never chosen (Fn::If)',
    });
    // The outputs that name a conditional resource under its condition: the validator
    // warns of each, and they are the stack's, so they are left out. The function takes
    // the variables' value itself.
    const environment = this.store.getOutput('Environment').value;
    const outputs = this.store.node.findChild('$Outputs');
    for (const name of ['Environment', 'AlarmTopicArn']) {
      outputs.node.tryRemoveChild(this.store.getOutput(name).node.id);
    }
    const logGroup = this.store.getResource('LogGroup') as logs.CfnLogGroup;
    this.function = new RustFunction(this, 'Handler', {
      manifestPath: props.manifestPath,
      binaryName: props.binaryName,
      functionName,
      architecture: lambda.Architecture.ARM_64,
      memorySize: props.memorySize ?? 256,
      timeout,
      tracing: lambda.Tracing.ACTIVE,
      loggingFormat: lambda.LoggingFormat.JSON,
      logGroup: logs.LogGroup.fromLogGroupName(this, 'Logs', logGroup.ref),
      environment: {
        SQS_KEEPER_STORE: environment,
        ...props.environment,
      },
    });
    const policy = this.store.getResource('HandlerPolicy') as iam.CfnManagedPolicy;
    this.function.role?.addManagedPolicy(
      iam.ManagedPolicy.fromManagedPolicyArn(this, 'StorePolicy', policy.ref),
    );
    const queue = this.store.getResource('SourceQueue') as sqs.CfnQueue;
    this.function.addEventSource(
      new SqsEventSource(sqs.Queue.fromQueueArn(this, 'Source', queue.attrArn), {
        reportBatchItemFailures: true,
        maxConcurrency: props.maxConcurrency ?? 10,
      }),
    );
  }
}

/** Says why `value` breaks `parameter`'s constraints, or nothing when it meets them. */
function refusal(parameter: CfnParameter, value: string): string | undefined {
  if (parameter.allowedValues !== undefined && !parameter.allowedValues.includes(value)) {
    return `is not one of ${parameter.allowedValues.join(', ')}`;
  }
  // CloudFormation matches the whole value, as Java's `matches` does.
  const whole = parameter.allowedPattern && new RegExp(`^(?:${parameter.allowedPattern})$`);
  if (whole && !whole.test(value)) {
    return `does not match ${parameter.allowedPattern}`;
  }
  if (parameter.type === 'Number') {
    const number = Number(value);
    if (value.trim() === '' || Number.isNaN(number)) {
      return 'is not a number';
    }
    if (parameter.minValue !== undefined && number < parameter.minValue) {
      return `is below ${parameter.minValue}`;
    }
    if (parameter.maxValue !== undefined && number > parameter.maxValue) {
      return `is above ${parameter.maxValue}`;
    }
  }
  return undefined;
}
