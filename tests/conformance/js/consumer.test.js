// Consuming: a SimpleConsumer receives and acks over a hundred messages intact, and a PushConsumer's listener
// gets every message sent, none flagged corrupted (the client checks each body against its digest and
// discards a mismatch before the listener sees it).
'use strict';
const { describe, it, after } = require('node:test');
const assert = require('node:assert/strict');
const {
  rmq, plain, logger, start, closeAll, producer, simpleConsumer, receive, uniqueTag, uniqueGroup,
} = require('./helper');

async function sendMany(p, topic, tag, n, body) {
  const sent = new Map();
  for (let i = 0; i < n; i += 20) {  // 20 in flight at a time
    const batch = [];
    for (let j = i; j < Math.min(n, i + 20); j++) {
      batch.push(p.send({ topic, tag, body: Buffer.from(body(j)) }).then(r => sent.set(r.messageId, body(j))));
    }
    await Promise.all(batch);
  }
  return sent;
}

describe('consume', () => {
  after(closeAll);

  it('SimpleConsumer receives and acks 102 messages, body and tag intact, none corrupted', async () => {
    const topic = plain.topics.bulk;
    const tag = uniqueTag();
    const p = await producer({ topic });
    const c = await simpleConsumer(topic, new rmq.FilterExpression(tag));
    const sent = await sendMany(p, topic, tag, 102, i => JSON.stringify({ hello: 'world', i }));
    assert.equal(sent.size, 102);
    const got = await receive(c, 102, { timeoutMs: 60000, batch: 20 });
    const corrupted = got.filter(m => m.corrupted).map(m => m.messageId);
    assert.equal(corrupted.length, 0, `${corrupted.length} of ${got.length} flagged corrupted (body digest)`);
    for (const m of got) {
      assert.equal(m.topic, topic);
      assert.equal(m.tag, tag);
      assert.equal(m.body.toString(), sent.get(m.messageId));
      assert.deepEqual(Object.keys(JSON.parse(m.body.toString())), [ 'hello', 'i' ]);
    }
    assert.deepEqual(new Set(got.map(m => m.messageId)), new Set(sent.keys()));
    assert.equal(got.length, 102);
  });

  it('PushConsumer listener gets every one of 200 messages once, none corrupted', async () => {
    const topic = plain.topics.push;
    const tag = uniqueTag();
    const p = await producer({ topic });
    const sent = await sendMany(p, topic, tag, 200, i => `push-${i}`);
    const calls = new Map();
    const corrupted = [];
    let done;
    const all = new Promise(resolve => { done = resolve; });
    await start(new rmq.PushConsumer({
      endpoints: plain.endpoints,
      consumerGroup: uniqueGroup('push'),
      subscriptions: new Map([ [ topic, new rmq.FilterExpression(tag) ] ]),
      requestTimeout: 5000,
      logger,
      messageListener: {
        consume(m) {
          calls.set(m.messageId, (calls.get(m.messageId) || 0) + 1);
          if (m.corrupted) corrupted.push(m.messageId);
          assert.equal(m.body.toString(), sent.get(m.messageId));
          if (calls.size >= sent.size) done();
          return rmq.ConsumeResult.SUCCESS;
        },
      },
    }));
    const timeout = new Promise(resolve => setTimeout(resolve, 60000).unref());
    await Promise.race([ all, timeout ]);
    assert.equal(calls.size, 200, `the listener got ${calls.size} of 200 (a corrupted message is discarded unseen)`);
    assert.deepEqual(corrupted, []);
    assert.deepEqual(new Set(calls.keys()), new Set(sent.keys()));
    assert.deepEqual([ ...calls.values() ].filter(n => n !== 1), [], 'a message reached the listener twice');
  });
});
