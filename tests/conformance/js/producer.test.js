// Sending: normal, delay, FIFO, transactional (commit and rollback) and recalled messages, each received
// (or not) by a SimpleConsumer. "Never received" is checked against a control message sent after (or due
// with) the one that must not arrive: once the control is received, the other would have been too.
'use strict';
const { describe, it, after } = require('node:test');
const assert = require('node:assert/strict');
const { rmq, plain, closeAll, producer, simpleConsumer, receive, receiveOnce, uniqueTag } = require('./helper');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const commitAll = { async check() { return TransactionResolution.COMMIT; } };

describe('send', () => {
  after(closeAll);

  it('normal: the receipt has an id, an offset and the id as transaction id; a tag subscription gets it', async () => {
    const topic = plain.topics.normal;
    const tag = uniqueTag();
    const p = await producer({ topic });
    const body = Buffer.from(JSON.stringify({ hello: 'rocketmq 😄', at: Date.now() }));
    const r = await p.send({ topic, tag, keys: [ 'k1', 'k2' ], body });
    assert.equal(typeof r.messageId, 'string');
    assert.ok(r.messageId.length > 0);
    assert.ok(r.offset >= 0, `offset ${r.offset}`);
    const c = await simpleConsumer(topic, new rmq.FilterExpression(tag));
    const [ m ] = await receive(c, 1);
    assert.equal(m.messageId, r.messageId);
    assert.deepEqual([ m.tag, m.body, [ ...m.keys ].sort() ], [ tag, body, [ 'k1', 'k2' ] ]);
    assert.ok(!m.corrupted, 'the body digest does not match the body'); // the client sets it only when true
    assert.equal(r.transactionId, r.messageId, 'the receipt\'s transaction id is the message id');
  });

  it('delay: received no earlier than due', async () => {
    const topic = plain.topics.delay;
    const tag = uniqueTag();
    const p = await producer({ topic });
    const c = await simpleConsumer(topic, tag);
    const sentAt = Date.now();
    const r = await p.send({ topic, tag, delay: 1000, body: Buffer.from('later') });
    const [ m ] = await receive(c, 1);
    const receivedAt = Date.now();
    assert.equal(m.messageId, r.messageId);
    assert.ok(m.deliveryTimestamp, 'a delay message carries its delivery time');
    assert.ok(m.deliveryTimestamp.getTime() - sentAt >= 1000);
    assert.ok(receivedAt >= m.deliveryTimestamp.getTime(),
      `received ${m.deliveryTimestamp.getTime() - receivedAt} ms before it was due`);
  });

  it('FIFO: received in order, with its message group and __SHARDINGKEY', async () => {
    const topic = plain.topics.fifo;
    const tag = uniqueTag();
    const p = await producer({ topic });
    const ids = [];
    for (let i = 0; i < 5; i++) {
      ids.push((await p.send({ topic, tag, messageGroup: 'order-42', body: Buffer.from(`fifo-${i}`) })).messageId);
    }
    const c = await simpleConsumer(topic, tag, { consumerGroup: plain.fifoGroup });
    const got = await receive(c, 5, { batch: 1 });
    assert.deepEqual(got.map(m => m.messageId), ids);
    assert.deepEqual(got.map(m => m.body.toString()), ids.map((_, i) => `fifo-${i}`));
    for (const m of got) {
      assert.equal(m.messageGroup, 'order-42');
      assert.equal(m.properties.get('__SHARDINGKEY'), 'order-42');
    }
  });

  it('transaction commit: received once, __transactionId__ is the receipt\'s transaction id', async () => {
    const topic = plain.topics.transaction;
    const tag = uniqueTag();
    const p = await producer({ topic, checker: commitAll });
    const tx = p.beginTransaction();
    const r = await p.send({ topic, tag, body: Buffer.from('committed') }, tx);
    await tx.commit();
    assert.ok(r.transactionId);
    const c = await simpleConsumer(topic, tag);
    const got = await receive(c, 1);
    got.push(...await receiveOnce(c));
    assert.equal(got.length, 1, 'a committed transaction is delivered once');
    assert.equal(got[0].messageId, r.messageId);
    assert.equal(got[0].properties.get('__transactionId__'), r.transactionId);
  });

  it('transaction rollback: never received', async () => {
    const topic = plain.topics.transaction;
    const tag = uniqueTag();
    const p = await producer({ topic, checker: commitAll });
    const tx = p.beginTransaction();
    const rolledBack = await p.send({ topic, tag, body: Buffer.from('rolled back') }, tx);
    await tx.rollback();
    const tx2 = p.beginTransaction();
    const control = await p.send({ topic, tag, body: Buffer.from('control') }, tx2);
    await tx2.commit();
    const c = await simpleConsumer(topic, tag);
    const got = await receive(c, 1);
    got.push(...await receiveOnce(c));
    assert.deepEqual(got.map(m => m.messageId), [ control.messageId ]);
    assert.notEqual(rolledBack.messageId, control.messageId);
  });

  it('recall: a delay message recalled before it is due is never received', async () => {
    const topic = plain.topics.recall;
    const tag = uniqueTag();
    const p = await producer({ topic });
    const c = await simpleConsumer(topic, tag);
    const due = new Date(Date.now() + 3000);
    const r = await p.send({ topic, tag, deliveryTimestamp: due, body: Buffer.from('recalled') });
    const control = await p.send({ topic, tag, deliveryTimestamp: due, body: Buffer.from('control') });
    assert.ok(r.recallHandle, 'a delay message\'s receipt carries a recall handle');
    const recalled = await p.recallMessage(topic, r.recallHandle);
    assert.equal(recalled.messageId, r.messageId);
    const got = await receive(c, 1);
    got.push(...await receiveOnce(c));
    assert.deepEqual(got.map(m => m.messageId), [ control.messageId ]);
  });
});
