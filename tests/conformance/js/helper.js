// Shared by the Node.js conformance tests (node --test): the broker groups the Python driver started
// (tests/conformance/test_node_client.py), passed in environment variables, and small helpers.
// NODE_PATH points at the pinned rocketmq-client-nodejs the driver installed.
'use strict';
const { randomUUID } = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const util = require('node:util');
const rmq = require('rocketmq-client-nodejs');

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through tests/conformance/test_node_client.py`);
  return v;
}

// grpc-js dials one host:port only, so each client gets one node's address (docs/rocketmq.md, Endpoints).
const plain = {
  endpoints: env('CONF_ENDPOINT'),
  topics: JSON.parse(env('CONF_TOPICS')),
  fifoGroup: env('CONF_FIFO_GROUP'),
};
const secure = {
  endpoints: env('CONF_SECURE_ENDPOINT'),
  topic: env('CONF_SECURE_TOPIC'),
  sessionCredentials: { accessKey: env('CONF_SECURE_AK'), accessSecret: env('CONF_SECURE_SK') },
  // grpc-js trusts the CA in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, which the driver sets.
  sslEnabled: true,
};

// One logger for every client of the process, appending to a file under $HOME (the driver's temporary
// directory): the client's default logger is shared by its clients and closed by the first shutdown.
const logFile = path.join(process.env.HOME || os.tmpdir(), 'rocketmq-client-nodejs.log');
const write = level => (...args) => {
  fs.appendFileSync(logFile, `${new Date().toISOString()} ${level} ${util.format(...args)}\n`);
};
const logger = { debug() {}, info: write('INFO'), warn: write('WARN'), error: write('ERROR'), close() {} };

const AWAIT_MS = 1000; // a SimpleConsumer's long-polling wait: short, so no test idles long on an empty topic
const INVISIBLE_MS = 20000;

const uniqueTag = () => `t${randomUUID().slice(0, 12)}`;
const uniqueGroup = (what) => `conf-js-${what}-${randomUUID().slice(0, 12)}`;

// Every client a test starts, shut down by closeAll() in its after hook, also when it fails.
const started = [];
async function start(client) {
  started.push(client);
  await client.startup();
  return client;
}
async function closeAll() {
  while (started.length) {
    const c = started.pop();
    try { await c.shutdown(); } catch { /* it may never have started */ }
  }
}

function producer(options = {}) {
  return start(new rmq.Producer({ endpoints: plain.endpoints, requestTimeout: 5000, logger, ...options }));
}

function simpleConsumer(topic, filter, options = {}) {
  return start(new rmq.SimpleConsumer({
    endpoints: plain.endpoints,
    consumerGroup: uniqueGroup('simple'),
    subscriptions: new Map([ [ topic, filter ] ]),
    awaitDuration: AWAIT_MS,
    requestTimeout: 5000,
    logger,
    ...options,
  }));
}

// Receive and ack until `want` messages came (each acked as it comes), within timeoutMs.
async function receive(consumer, want, { timeoutMs = 30000, batch = 32 } = {}) {
  const got = [];
  const deadline = Date.now() + timeoutMs;
  while (got.length < want) {
    if (Date.now() > deadline) throw new Error(`received ${got.length} of ${want} within ${timeoutMs} ms`);
    for (const m of await receiveOnce(consumer, batch)) {
      got.push(m);
      await consumer.ack(m);
    }
  }
  return got;
}

// One receive; an empty long poll is an answer, not an error (the client raises MESSAGE_NOT_FOUND as one).
async function receiveOnce(consumer, batch = 32) {
  try {
    return await consumer.receive(batch, INVISIBLE_MS);
  } catch (e) {
    if (e instanceof rmq.NotFoundException || /not ?found|no (new )?message/i.test(String(e && e.message))) return [];
    throw e;
  }
}

// The exceptions a client error wraps, outermost first (the 1.0.8 client's startup error wraps an Error
// wrapping the server's refusal).
function causes(err) {
  const out = [];
  for (let e = err; e && out.length < 8; e = e.cause) out.push(e);
  return out;
}

module.exports = {
  rmq, plain, secure, logger, causes, AWAIT_MS, uniqueTag, uniqueGroup, start, closeAll, producer, simpleConsumer,
  receive, receiveOnce,
};
