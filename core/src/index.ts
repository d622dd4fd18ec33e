export * from './errors.ts';
export * from './ids.ts';
export * from './schemas/account.ts';
export * from './schemas/audit.ts';
export * from './schemas/auth.ts';
export * from './schemas/common.ts';
