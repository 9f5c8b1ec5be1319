// Priority messages and lite topics, which this broker does not serve: the route's accepted message types
// exclude them, so the client refuses the send naming the type; the driver then checks nothing was stored.
'use strict';
const { describe, it, after } = require('node:test');
const assert = require('node:assert/strict');
const { plain, closeAll, producer } = require('./helper');
const { MessageType } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

describe('unsupported message types', () => {
  after(closeAll);

  for (const [ kind, extra, type ] of [
    [ 'priority', { priority: 1 }, MessageType.PRIORITY ],
    [ 'lite', { liteTopic: 'conf-lite-child' }, MessageType.LITE ],
  ]) {
    it(`refuses a ${kind} message, naming its type`, async () => {
      const topic = plain.topics[kind];
      const p = await producer({ topic });
      // The 1.0.8 client names the type by its number (PRIORITY = 6, LITE = 5); a server that let it through
      // would answer UNSUPPORTED (tests/conformance/test_python_client.py sends that request raw).
      await assert.rejects(p.send({ topic, body: Buffer.from('not supported'), ...extra }), e => {
        const byClient = /message type not match/i.test(e.message) && e.message.includes(`actualMessageType=${type}`);
        const byServer = e.code === 50500 || /unsupported/i.test(e.message);
        assert.ok(byClient || byServer, e.message);
        if (byServer) assert.match(e.message, new RegExp(kind, 'i'));
        return true;
      });
    });
  }
});
