export * from './connect.ts';
export * from './migrate.ts';
export * as accounts from './queries/accounts.ts';
export * as audit from './queries/audit.ts';
export * as authTokens from './queries/auth-tokens.ts';
export * as credentials from './queries/credentials.ts';
export * as inferenceCredentials from './queries/inference-credentials.ts';
export * as oauthCodes from './queries/oauth-codes.ts';
export * as sessions from './queries/sessions.ts';
