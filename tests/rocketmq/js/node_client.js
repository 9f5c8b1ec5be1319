// The official Node.js RocketMQ 5 client (npm rocketmq-client-nodejs) against a dledger broker group, driven by
// tests/rocketmq/test_node_client.py. One JSON line on stdout per run; errors go to stderr and exit 1.
//   node node_client.js produce ENDPOINT TOPIC PREFIX COUNT [TAG]     -> {"sent": [{"id", "body"}...]}
//   node node_client.js consume ENDPOINT TOPIC GROUP EXPECTED SECONDS [SQL] -> {"received": [{"id", "body", "tag"}...]}
// NODE_PATH points at the cache dir the test installed the client into.
'use strict';
const { Producer, SimpleConsumer, FilterExpression } = require('rocketmq-client-nodejs');
const { FilterType } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

async function produce(endpoints, topic, prefix, count, tag) {
  const producer = new Producer({ endpoints, topic, requestTimeout: 5000 });
  await producer.startup();
  const sent = [];
  try {
    for (let i = 0; i < count; i++) {
      const body = `${prefix}${i}`;
      const properties = new Map([ [ 'i', String(i) ], [ 'prefix', prefix ] ]);
      const r = await producer.send({ topic, tag: tag || undefined, body: Buffer.from(body), properties });
      sent.push({ id: r.messageId, body });
    }
  } finally {
    await producer.shutdown();
  }
  return { sent };
}

async function consume(endpoints, topic, group, expected, seconds, sql) {
  const filter = sql ? new FilterExpression(sql, FilterType.SQL) : '*';
  const consumer = new SimpleConsumer({
    endpoints, consumerGroup: group, subscriptions: new Map([ [ topic, filter ] ]),
    awaitDuration: 2000, requestTimeout: 5000,
  });
  await consumer.startup();
  const received = [];
  const deadline = Date.now() + seconds * 1000;
  try {
    while (received.length < expected && Date.now() < deadline) {
      let got = [];
      try {
        got = await consumer.receive(32, 20000);
      } catch (e) {
        if (!/not ?found|no message/i.test(String(e && e.message))) throw e;
      }
      for (const m of got) {
        if (m.corrupted) throw new Error(`message ${m.messageId} flagged corrupted: its body digest does not match`);
        received.push({ id: m.messageId, body: m.body.toString(), tag: m.tag || null });
        await consumer.ack(m);
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { received };
}

async function main() {
  const [ cmd, ...a ] = process.argv.slice(2);
  let out;
  if (cmd === 'produce') out = await produce(a[0], a[1], a[2], parseInt(a[3], 10), a[4]);
  else if (cmd === 'consume') out = await consume(a[0], a[1], a[2], parseInt(a[3], 10), parseFloat(a[4]), a[5]);
  else throw new Error(`unknown command ${cmd}`);
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().then(() => process.exit(0), e => {
  process.stderr.write(`node client failed: ${e && e.stack || e}\n`);
  process.exit(1);
});
