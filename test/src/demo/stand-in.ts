/**
 * The model the demo runs against: the fake Anthropic Messages API of the tests with a
 * scripted, friendly answer. Each turn takes two Messages calls, as a real model's would when
 * it uses a tool: the first asks Claude Code to run `pwd` in its sandbox (so the stream shows a
 * tool call and its result), the second answers in words, echoing the prompt.
 */
import { type FakeAnthropic, type MessagesBody, startFakeAnthropic } from '../fakes/anthropic-messages.ts';

/** The inference credential the stand-in accepts: not a real key, it reaches no one. */
export const DEMO_KEY = 'sk-ant-demo-key-for-the-local-stand-in';
/** The model the demo's agent names; the stand-in answers to any. */
export const DEMO_MODEL = 'claude-sonnet-4-5';

type Message = NonNullable<MessagesBody['messages']>[number];
type Block = Exclude<Message['content'], string>[number];

const blocksOf = (m: Message | undefined): Block[] =>
  typeof m?.content === 'string' ? [{ type: 'text', text: m.content }] : (m?.content ?? []);

/** Claude Code adds `<system-reminder>` text blocks beside the person's words. */
const personText = (b: Block) =>
  b.type === 'text' && typeof b.text === 'string' && !b.text.trimStart().startsWith('<system-reminder>');

/** The words of the latest prompt: the last text a person typed in a user message. */
function latestPrompt(body: MessagesBody): string {
  for (const m of [...(body.messages ?? [])].reverse()) {
    if (m.role !== 'user') continue;
    const texts = blocksOf(m).filter(personText);
    if (texts.length) return String(texts.at(-1)?.text).trim();
  }
  return '';
}

/** The text of the tool result in the last user message, or undefined when it carries none. */
function toolResult(body: MessagesBody): string | undefined {
  const result = blocksOf(body.messages?.at(-1)).find((b) => b.type === 'tool_result');
  if (!result) return undefined;
  const content = result.content as string | Block[] | undefined;
  const text = typeof content === 'string' ? content : (content ?? []).map((b) => String(b.text ?? '')).join('');
  return text.trim();
}

/**
 * Starts the stand-in on a free loopback port. `onCall` hears of each Messages call as it is
 * answered, in a short line (the demo prints them, so a newcomer sees Claude Code at work).
 */
export function startStandInModel(onCall: (line: string) => void): Promise<FakeAnthropic> {
  return startFakeAnthropic({
    apiKey: DEMO_KEY,
    models: [DEMO_MODEL],
    reply(body) {
      const result = toolResult(body);
      if (result === undefined) {
        onCall('POST /v1/messages -> tool_use Bash {"command":"pwd"}');
        return {
          content: [
            { type: 'tool_use', name: 'Bash', input: { command: 'pwd', description: 'Show the working directory' } },
          ],
        };
      }
      onCall('POST /v1/messages (with the tool result) -> text');
      return {
        content: [
          {
            type: 'text',
            text:
              'Hello! I am not a real model but a local stand-in for the Anthropic Messages API, started by ' +
              '`npm run demo` so that the real Claude Code agent can run a turn without a model key. ' +
              `You said: "${latestPrompt(body)}". Claude Code ran \`pwd\` for me in its sandbox: ${result}. ` +
              'With a real key stored as your inference credential, the same turn reaches Claude.',
          },
        ],
      };
    },
  });
}
