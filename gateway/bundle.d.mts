// Types of bundle.mjs (plain JavaScript: start.mjs and test/run.mjs run it before install).
export const BUNDLE: string;
export const CHILD_BUNDLE: string;
export const SOURCES: readonly string[];
export function ensureBundle(options?: {
  entry?: string;
  outfile?: string;
  sources?: readonly string[];
}): Promise<boolean>;
/** esbuild options every build of the workspace's TypeScript shares (bundle.mjs says which). */
export const WORKSPACE_BUILD: Record<string, unknown>;
