// Shared helpers for the CPU test suite: fresh random inputs every run (the seed is printed, and
// QMOE_TEST_SEED reproduces a failing run), relative-norm error, NaN checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace qmoe::test {

// Sets (or, with nullptr, unsets) an environment variable for a scope, then restores it. Only
// around prepare_layer(): the library reads the environment there and nowhere else.
class EnvOverride {
 public:
  EnvOverride(const char* name, const char* v) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (v != nullptr) {
      setenv(name, v, 1);
    } else {
      unsetenv(name);
    }
  }
  ~EnvOverride() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  EnvOverride(const EnvOverride&) = delete;
  EnvOverride& operator=(const EnvOverride&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// A fresh seed per call unless QMOE_TEST_SEED is set; recorded in the test's output.
inline uint64_t fresh_seed() {
  static uint64_t counter = 0;
  const char* env = std::getenv("QMOE_TEST_SEED");
  uint64_t base = env ? std::strtoull(env, nullptr, 0) : std::random_device{}();
  uint64_t seed = base + 0x9E3779B97F4A7C15ull * (counter++);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

inline std::vector<float> gaussian(size_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

template <typename A, typename B>
double rel_norm(const A* a, const B* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den == 0 ? (num == 0 ? 0.0 : INFINITY) : std::sqrt(num / den);
}

// A fixture owning a fresh temporary directory; path() names a file in it, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/qmoe_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& f : files_) std::remove(f.c_str());
    rmdir(dir_.c_str());
  }
  std::string path(const std::string& name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }

  std::string dir_;
  std::vector<std::string> files_;
};

}  // namespace qmoe::test
