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
import { Duration, Stack, Validations } from 'aws-cdk-lib';
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
    this.store = new include.CfnInclude(this, 'Store', {
      templateFile: props.storeTemplate ?? STORE_TEMPLATE,
      parameters: props.storeParameters,
    });
    // The two parameters the function fixes stay parameters, pinned to its values: a value
    // replaced in place would leave each Fn::Sub that named it with nothing to substitute.
    const pin = (name: string, value: string) => {
      const parameter = this.store.getParameter(name);
      parameter.default = value;
      parameter.allowedValues = [value];
    };
    pin('FunctionName', functionName);
    pin('TimeoutSeconds', String(timeout.toSeconds()));
    // The store's alarms and outputs choose a topic or a table under a condition (Fn::If),
    // which the synthesis-time validator does not follow: it warns of an empty topic and of
    // a reference to a resource that may not exist. cfn-lint checks the store whole.
    // Outputs are the stack's, so that acknowledgement is the stack's.
    Validations.of(this.store).acknowledge({
      id: 'CloudFormation-Validate::W1030',
      reason: 'an empty topic is never chosen (Fn::If)',
    });
    Validations.of(Stack.of(this)).acknowledge({
      id: 'CloudFormation-Validate::W1001',
      reason: "the store's outputs refer to a conditional resource only under its condition",
    });
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
        SQS_KEEPER_STORE: this.store.getOutput('Environment').value,
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
