// Client startup: with credentials over TLS on a secure group, refused with a wrong access key or secret,
// without credentials on a plain group, and refused for a topic that does not exist.
'use strict';
const { describe, it, after } = require('node:test');
const assert = require('node:assert/strict');
const {
  rmq, plain, secure, logger, causes, start, closeAll, producer, receive, uniqueTag, uniqueGroup, AWAIT_MS,
} = require('./helper');

function secureProducer(sessionCredentials) {
  return new rmq.Producer({
    endpoints: secure.endpoints, sslEnabled: true, sessionCredentials, topic: secure.topic, requestTimeout: 5000, logger,
  });
}

function secureConsumer(sessionCredentials, tag = '*') {
  return new rmq.SimpleConsumer({
    endpoints: secure.endpoints, sslEnabled: true, sessionCredentials, consumerGroup: uniqueGroup('sec'),
    subscriptions: new Map([ [ secure.topic, tag ] ]), awaitDuration: AWAIT_MS, requestTimeout: 5000, logger,
  });
}

// The startup error and the server's refusal inside it. The 1.0.8 client wraps it twice: "Startup the
// rocketmq client failed, clientId=..., error=Error: Failed to fetch topic routes after 3 attempts", whose
// cause's cause is the typed exception (after three route queries, 1 s and 2 s apart).
async function refused(client, ...types) {
  let err;
  await assert.rejects(start(client), e => { err = e; return true; });
  assert.match(err.message, /Startup the rocketmq client failed, clientId=[^,]+, error=/);
  const typed = causes(err).find(e => types.some(t => e instanceof t));
  assert.ok(typed, `no ${types.map(t => t.name)} in ${causes(err).map(e => e.message).join(' <- ')}`);
  return typed;
}

describe('startup', () => {
  after(closeAll);

  it('starts with credentials over TLS on a secure group, sends and receives', async () => {
    const tag = uniqueTag();
    const p = await start(secureProducer(secure.sessionCredentials));
    const c = await start(secureConsumer(secure.sessionCredentials, tag));
    const r = await p.send({ topic: secure.topic, tag, body: Buffer.from('signed') });
    const [ m ] = await receive(c, 1);
    assert.equal(m.messageId, r.messageId);
    assert.equal(m.body.toString(), 'signed');
  });

  // RocketMQ's ACL answers FORBIDDEN for both ("Username is not matched", "Check signature failed for
  // accessKey"); we answer UNAUTHORIZED (40100): either is the client's refusal of the credentials.
  for (const [ what, creds ] of [
    [ 'access key', () => ({ ...secure.sessionCredentials, accessKey: 'wrong' }) ],
    [ 'secret', () => ({ ...secure.sessionCredentials, accessSecret: 'wrong' }) ],
  ]) {
    it(`refuses a wrong ${what} at startup`, async () => {
      for (const client of [ secureProducer(creds()), secureConsumer(creds()) ]) {
        const e = await refused(client, rmq.UnauthorizedException, rmq.ForbiddenException);
        assert.ok([ 40100, 40300 ].includes(e.code), `code ${e.code}`);
      }
    });
  }

  it('needs no credentials on a plain group', async () => {
    const p = await producer({ topic: plain.topics.normal });
    const r = await p.send({ topic: plain.topics.normal, tag: uniqueTag(), body: Buffer.from('plain') });
    assert.ok(r.messageId);
  });

  it('fails with NotFoundException for a topic that does not exist', async () => {
    const e = await refused(
      new rmq.Producer({ endpoints: plain.endpoints, topic: 'conf-js-no-such-topic', requestTimeout: 5000, logger }),
      rmq.NotFoundException);
    assert.equal(e.name, 'NotFoundException');
    assert.equal(e.code, 40402);
    assert.match(e.message, /conf-js-no-such-topic/);
  });
});
