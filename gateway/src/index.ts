export { type Config, ConfigError, loadConfig } from './config.ts';
export { createLogger, type Service, type ServiceOverrides, startService } from './main.ts';
export { EXIT_IN_USE, InUseError } from './processes/in-use.ts';
export { runFromEnv } from './start.ts';
