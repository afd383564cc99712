// A minimal HTTP/1.0 client for the daemons' metrics endpoints on this machine.
#pragma once

#include <string>

namespace shardsync::localsync {

// GET http://127.0.0.1:port/path: the whole response, headers included ("" if none).
std::string HttpGet(int port, const std::string& path);

}  // namespace shardsync::localsync
