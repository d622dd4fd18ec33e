export { type Config, ConfigError, loadConfig } from './config.ts';
export { createLogger, runFromEnv, type Service, startService } from './main.ts';
