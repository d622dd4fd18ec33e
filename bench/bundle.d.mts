// Types of bundle.mjs (plain JavaScript: test/run.mjs runs it).
export const SERVE: string;
export const SERVE_BUNDLE: string;
export function ensureServeBundle(): Promise<boolean>;
export const CLI_DIST: string;
export const CLI_BUNDLE: string;
export function ensureCliBundle(): Promise<boolean>;
