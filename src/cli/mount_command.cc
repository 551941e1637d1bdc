// `farpool mount` and `farpool umount`: the pool as a filesystem (src/tier/fuse/).
#include <memory>

#include "cli/commands.h"
#include "tier/fuse/fuse_mount.h"

namespace farpool::cli {

Command RegisterMount(CLI::App& app) {
  auto o = std::make_shared<fuse::MountOptions>();
  CLI::App* sub = app.add_subcommand(
      "mount", "Mount a filesystem in the pool (FUSE); returns once mounted, like mount(8)");
  sub->add_option("--cluster", o->cluster_file, "cluster.json")->required();
  sub->add_option("--name", o->name, "The filesystem in the pool (default: fs)");
  sub->add_flag("--foreground", o->foreground, "Serve in this process until unmounted");
  sub->add_option("--log", o->log,
                  "The daemon's log of errors (default: /tmp/farpool-mount-NAME.log)");
  sub->add_option("--dirty-share", o->dirty_share,
                  "Percent of the kernel's dirty page limit this mount's page cache may hold "
                  "(the kernel's default for FUSE: 1; needs root)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  sub->add_flag("--direct-io", o->direct_io,
                "Bypass the page cache: every read and write goes to the pool (for spill "
                "directories; mmap(MAP_SHARED) of its files fails)");
  sub->add_option("mountpoint", o->mountpoint, "An empty directory")->required();
  return {sub, [o] {
            auto done = fuse::Mount(*o);
            if (!done.ok()) return Fail(done.status().message());
            std::printf("farpool: %s\n", done->c_str());
            return 0;
          }};
}

Command RegisterUmount(CLI::App& app) {
  struct Args {
    std::string mountpoint;
    bool lazy = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "umount", "Unmount a farpool mount and wait for its daemon to release the mount lease");
  sub->add_flag("--lazy", a->lazy,
                "Detach now even if files are open; the daemon ends when they are closed");
  sub->add_option("mountpoint", a->mountpoint, "Where it is mounted")->required();
  return {sub, [a] {
            Status s = fuse::Unmount(a->mountpoint, a->lazy);
            return s.ok() ? 0 : Fail(s.message());
          }};
}

}  // namespace farpool::cli
