import { z } from 'zod';

/*
 * Why a turn failed, in words a user can act on: the `error` of a Turn (`{code, message}`) and
 * the `code` beside `error` in the data of its `turn` (and `model`) stage `failed`. The runner
 * classifies what its runtime reported (the ACP error, the exit and the last stderr lines, a
 * spawn that found no command); the service classifies the ends it decides itself.
 */

/** Every code a failed turn carries, with what it means (the README lists the same). */
export const TURN_ERROR_CODES = {
  invalid_api_key: 'The model provider refused the credential (401 or 403).',
  provider_unreachable: 'The runtime could not reach the model provider (refused, no such host, timed out).',
  provider_error: 'The model provider answered with another error (rate limit, overload, unknown model).',
  agent_not_installed: "The runtime's agent command is not installed on the machine.",
  agent_crashed: 'The runtime failed or exited without answering the turn.',
  sandbox_failed: 'The sandbox could not be built or woken, so the turn never ran.',
  runner_offline: 'The machine running the sandbox went away and did not come back in time.',
} as const;

export type TurnErrorCode = keyof typeof TURN_ERROR_CODES;

export const TurnError = z
  .object({
    code: z.enum(Object.keys(TURN_ERROR_CODES) as [TurnErrorCode, ...TurnErrorCode[]]).meta({
      description: Object.entries(TURN_ERROR_CODES)
        .map(([code, meaning]) => `\`${code}\`: ${meaning}`)
        .join(' '),
    }),
    message: z.string().meta({ description: 'What went wrong and what to fix.' }),
  })
  .meta({ id: 'TurnError' });

export type TurnError = z.infer<typeof TurnError>;

/** Codes that name the model provider as the cause: their turn also reports stage `model` failed. */
export const PROVIDER_ERROR_CODES: ReadonlySet<TurnErrorCode> = new Set([
  'invalid_api_key',
  'provider_unreachable',
  'provider_error',
]);

/** What the service knows of each runtime: its provider's name, where its credential is set, its base URL variable, its agent's npm package. */
const RUNTIMES: Record<string, { provider: string; credentials: string; baseUrl: string; pkg: string }> = {
  claude: {
    provider: 'Anthropic',
    credentials: 'PUT /api/account/inference-credentials/anthropic_api_key, or claude_code_oauth_token',
    baseUrl: 'ANTHROPIC_BASE_URL',
    pkg: '@zed-industries/claude-agent-acp',
  },
  codex: {
    provider: 'OpenAI',
    credentials: 'PUT /api/account/inference-credentials/openai_api_key',
    baseUrl: 'OPENAI_BASE_URL',
    pkg: '@zed-industries/codex-acp',
  },
  gemini: {
    provider: 'Google',
    credentials: 'PUT /api/account/inference-credentials/gemini_api_key',
    baseUrl: "GOOGLE_GEMINI_BASE_URL, or the instance's GEMINI_BASE_URL",
    pkg: '@google/gemini-cli',
  },
  opencode: {
    provider: 'The model provider',
    credentials: "PUT /api/account/inference-credentials/<your model's provider>",
    baseUrl: 'ANTHROPIC_BASE_URL, OPENAI_BASE_URL or GEMINI_BASE_URL',
    pkg: 'opencode-ai',
  },
};

/** How the runtime ran: its name (`claude`, ...; absent from a service one release older) and command. */
export interface RuntimeIdentity {
  runtime?: string | undefined;
  command?: string | undefined;
  /**
   * Whose RUNTIME_<NAME>_COMMAND chose the command, so a failure names the setting to change:
   * `runner` on a self-hosted runner (its own, on its machine, which wins over the service's),
   * `service` on a runner-agent the service's `local` provider started (it runs the service's).
   */
  settings?: 'runner' | 'service' | undefined;
}

const AUTH = [
  /invalid (x-)?api[ -_]?key/i,
  /authentication[_ ]error/i,
  /\b(401|403)\b.*\b(unauthori[sz]ed|forbidden|permission|api key|credential)/i,
  /\b(unauthori[sz]ed|forbidden)\b.*\b(401|403)\b/i,
  /incorrect api key/i,
  /api key not valid/i,
  /oauth token (has expired|is invalid)/i,
];
const UNREACHABLE = [
  /unable to connect to api/i,
  /\b(ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ECONNRESET|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|UND_ERR_CONNECT_TIMEOUT)\b/,
  /connection (refused|error|timed out)/i,
  /error sending request/i,
  /fetch failed/i,
  /request timed out/i,
];
const PROVIDER = [
  /\bAPI Error\b/i,
  /rate[_ ]limit/i,
  /overloaded/i,
  /\b(429|500|502|503|529)\b.*error/i,
  /not_found_error|model.*(not found|does not exist)/i,
];

/** The runtime's own words, trimmed to a line a person reads: JSON-RPC's "Internal error: " goes. */
function said(text: string): string {
  const line = text
    .replace(/^Internal error:\s*/i, '')
    .replace(/\s+/g, ' ')
    .trim();
  return line.length > 500 ? `${line.slice(0, 500)}…` : line;
}

/**
 * Classifies what a runtime reported when its turn failed (the ACP error message, or the exit
 * with its last stderr lines, in `text`) into a code and a message saying what to fix. When
 * `text` says nothing recognisable (codex-acp answers a refused key with a bare "Internal
 * error"), the turn's last `stderr` lines are read, newest first, and the first that says
 * something is quoted. Pure: the same input always gives the same answer; an unrecognised
 * failure is `agent_crashed`, quoting what the runtime said.
 */
export function classifyRuntimeFailure(text: string, who: RuntimeIdentity, stderr: readonly string[] = []): TurnError {
  const direct = classifyText(text, who);
  if (direct.code !== 'agent_crashed') return direct;
  for (let i = stderr.length - 1; i >= 0; i--) {
    const line = plain(stderr[i] as string);
    const found = line.trim() ? classifyText(line, who) : direct;
    if (found.code !== 'agent_crashed') return found;
  }
  return direct;
}

/** A terminal's colours and styles (ANSI escape sequences) taken out of a line. */
const ANSI = new RegExp(`${String.fromCharCode(27)}\\[[0-9;]*[A-Za-z]`, 'g');
const plain = (line: string) => line.replace(ANSI, '');

function classifyText(text: string, who: RuntimeIdentity): TurnError {
  const known = who.runtime ? RUNTIMES[who.runtime] : undefined;
  const provider = known?.provider ?? 'The model provider';
  const quote = said(text);
  if (AUTH.some((re) => re.test(text))) {
    const where = known
      ? `the account's inference credential (${known.credentials})`
      : "the account's inference credential (PUT /api/account/inference-credentials/<provider>)";
    const status = /\b403\b|forbidden|permission/i.test(text) ? 403 : 401;
    return {
      code: 'invalid_api_key',
      message: `${provider} refused the API key (${status}): update ${where}, or the key variable the environment or vault sets. The runtime said: ${quote}`,
    };
  }
  if (UNREACHABLE.some((re) => re.test(text))) {
    return {
      code: 'provider_unreachable',
      message: `${provider}'s API could not be reached from the sandbox: check the base URL the environment, vault or instance sets (${known?.baseUrl ?? 'the provider base URL variable'}), the machine's network, and the environment's allowed_hosts. The runtime said: ${quote}`,
    };
  }
  if (PROVIDER.some((re) => re.test(text))) {
    return {
      code: 'provider_error',
      message: `${provider}'s API answered with an error; try again later, or check the agent's model. The runtime said: ${quote}`,
    };
  }
  return {
    code: 'agent_crashed',
    message: `The ${who.runtime ?? 'agent'} runtime failed the turn: ${quote}`,
  };
}

/**
 * The failure of a runtime whose command could not be started: a missing command (ENOENT, or
 * EACCES for a file that is not executable) names the command, how to install it, and the
 * setting that points at it where it is read (`who.settings`): a self-hosted runner's own
 * RUNTIME_<NAME>_COMMAND on its machine, or the service's. Anything else is `agent_crashed`.
 */
export function classifySpawnFailure(errno: string | undefined, detail: string, who: RuntimeIdentity): TurnError {
  if (errno === 'ENOENT' || errno === 'EACCES') {
    const known = who.runtime ? RUNTIMES[who.runtime] : undefined;
    const setting = who.runtime ? `RUNTIME_${who.runtime.toUpperCase()}_COMMAND` : 'RUNTIME_<NAME>_COMMAND';
    const command = who.command ?? 'of the runtime';
    const install = known ? `install it there with \`npm install -g ${known.pkg}\`` : 'install it there';
    const where =
      who.settings === 'runner'
        ? `set ${setting} in svc-runner's environment on that machine to its command line`
        : `set the service's ${setting} to its path`;
    const machine = who.settings === 'runner' ? "the runner's machine" : 'the machine running the sandbox';
    return {
      code: 'agent_not_installed',
      message: `The agent command ${command} is not installed on ${machine} (${errno === 'ENOENT' ? 'not found on PATH' : 'not executable'}): ${install}, or ${where}.`,
    };
  }
  return { code: 'agent_crashed', message: `The agent command could not start: ${said(detail)}` };
}

/**
 * The error of a turn's end from the data of its `turn` stage event: `{code, error}` as this
 * release writes it, or a bare `error` string (a runner one release older), classified here.
 * Undefined when the data names no error.
 */
export function turnErrorOf(data: string | null, who: RuntimeIdentity = {}): TurnError | undefined {
  if (!data) return undefined;
  let parsed: { code?: unknown; error?: unknown };
  try {
    parsed = JSON.parse(data) as typeof parsed;
  } catch {
    return undefined;
  }
  if (typeof parsed?.error !== 'string' || !parsed.error) return undefined;
  if (typeof parsed.code === 'string' && parsed.code in TURN_ERROR_CODES) {
    return { code: parsed.code as TurnErrorCode, message: parsed.error };
  }
  return classifyRuntimeFailure(parsed.error, who);
}
