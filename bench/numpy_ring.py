"""A plain numpy replay buffer in the style of Stable-Baselines3's ReplayBuffer.

What Python users run today, as the baseline of bench/compare: arrays
preallocated for the whole capacity, laid out [buffer_size, n_envs, ...],
observations and next observations stored separately (SB3's default,
optimize_memory_usage=False), a write position that wraps, and sampling by
random indices (np.random.randint over the filled part, a random env per
row) followed by fancy-index gathers. Written from SB3's documented
behaviour, not copied.

    buf = NumpyRing(100_000, obs_shape=(4,), obs_dtype=np.float32, n_envs=8)
    buf.add(obs, next_obs, action, reward, done, timeout)      # one step of every env
    buf.extend(obs, next_obs, action, reward, done, timeout)   # k steps: arrays [k, n_envs, ...]
    obs, action, next_obs, done, reward = buf.sample(256)
"""

import numpy as np


class NumpyRing:
    def __init__(self, capacity, obs_shape, obs_dtype, n_envs=1, action_dtype=np.int64, action_dim=1, seed=None):
        self.n_envs = n_envs
        self.buffer_size = max(capacity // n_envs, 1)
        shape = (self.buffer_size, n_envs)
        self.observations = np.zeros(shape + tuple(obs_shape), dtype=obs_dtype)
        self.next_observations = np.zeros(shape + tuple(obs_shape), dtype=obs_dtype)
        self.actions = np.zeros(shape + (action_dim,), dtype=action_dtype)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.dones = np.zeros(shape, dtype=np.float32)
        self.timeouts = np.zeros(shape, dtype=np.float32)  # truncations: bootstrap through them
        self.pos = 0
        self.full = False
        self.rng = np.random.default_rng(seed)

    def arrays(self):
        return [self.observations, self.next_observations, self.actions, self.rewards, self.dones, self.timeouts]

    def nbytes(self):
        """Bytes the buffer holds (all preallocated)."""
        return sum(a.nbytes for a in self.arrays())

    def size(self):
        return (self.buffer_size if self.full else self.pos) * self.n_envs

    def add(self, obs, next_obs, action, reward, done, timeout):
        """One step of every env (arrays [n_envs, ...]), as SB3's add()."""
        self.observations[self.pos] = obs
        self.next_observations[self.pos] = next_obs
        self.actions[self.pos] = np.reshape(action, (self.n_envs, -1))
        self.rewards[self.pos] = reward
        self.dones[self.pos] = done
        self.timeouts[self.pos] = timeout
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full, self.pos = True, 0

    def extend(self, obs, next_obs, action, reward, done, timeout):
        """k steps at once (arrays [k, n_envs, ...]): add() vectorised, with
        at most two slice copies per array (before and after the wrap)."""
        k = len(obs)
        src = [obs, next_obs, np.reshape(action, (k, self.n_envs, -1)), reward, done, timeout]
        start = 0
        while start < k:
            n = min(k - start, self.buffer_size - self.pos)
            for dst, s in zip(self.arrays(), src):
                dst[self.pos:self.pos + n] = s[start:start + n]
            start += n
            self.pos += n
            if self.pos == self.buffer_size:
                self.full, self.pos = True, 0

    def sample(self, batch_size):
        """(obs, action, next_obs, done, reward) for batch_size random rows:
        done is 0 on truncations (timeouts), as SB3 returns it."""
        upper = self.buffer_size if self.full else self.pos
        idx = self.rng.integers(0, upper, size=batch_size)
        env = self.rng.integers(0, self.n_envs, size=batch_size)
        return (self.observations[idx, env], self.actions[idx, env], self.next_observations[idx, env],
                (self.dones[idx, env] * (1 - self.timeouts[idx, env])).reshape(-1, 1),
                self.rewards[idx, env].reshape(-1, 1))
