/**
 * The orders example (examples/orders) on its store, as a CDK app: what infra/handler.yaml
 * deploys with SAM. `scripts/cdk.sh synth` synthesises it offline, bundling skipped.
 */
import * as path from 'node:path';
import { App, RemovalPolicy, Stack } from 'aws-cdk-lib';
import * as dynamodb from 'aws-cdk-lib/aws-dynamodb';
import * as iam from 'aws-cdk-lib/aws-iam';
import { QueueWorker } from '../lib/queue-worker';

const app = new App();
const stack = new Stack(app, 'Orders');
// The handler's own data: one item per order.
const orders = new dynamodb.Table(stack, 'OrdersTable', {
  partitionKey: { name: 'order_id', type: dynamodb.AttributeType.STRING },
  billingMode: dynamodb.BillingMode.PAY_PER_REQUEST,
  pointInTimeRecoverySpecification: { pointInTimeRecoveryEnabled: true },
  encryption: dynamodb.TableEncryption.AWS_MANAGED,
  removalPolicy: RemovalPolicy.RETAIN,
});
const worker = new QueueWorker(stack, 'Worker', {
  manifestPath: path.join(__dirname, '..', '..', '..', '..', 'examples', 'orders', 'Cargo.toml'),
  binaryName: 'orders-worker',
  storeParameters: { ItemIdSource: 'pointer:/order_id' },
  environment: { ORDERS_TABLE: orders.tableName },
});
// The orders example writes each order once, with a conditional PutItem.
worker.function.addToRolePolicy(
  new iam.PolicyStatement({ actions: ['dynamodb:PutItem'], resources: [orders.tableArn] }),
);
app.synth();
