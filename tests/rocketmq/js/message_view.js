// Decodes messages as the official Node.js client does (its own MessageView over its own generated protobuf
// code), for tests/rocketmq/test_digest.py. stdin: one base64 apache.rocketmq.v2.Message per line; stdout: one
// JSON line, [{"corrupted", "messageGroup", "properties"}...] in the same order.
'use strict';
const { MessageView } = require('rocketmq-client-nodejs/dist/message/MessageView');
const { Message } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const lines = require('node:fs').readFileSync(0, 'utf8').split('\n').filter(Boolean);
const out = lines.map(line => {
  const view = new MessageView(Message.deserializeBinary(Buffer.from(line, 'base64')));
  return { corrupted: view.corrupted === true, messageGroup: view.messageGroup, properties: Object.fromEntries(view.properties) };
});
process.stdout.write(JSON.stringify(out) + '\n');
