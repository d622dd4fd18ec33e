export { type Config, ConfigError, loadConfig } from './config.ts';
export { createLogger, runFromEnv, type Service, type ServiceOverrides, startService } from './main.ts';
