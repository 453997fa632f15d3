#include <iostream>

int main(int argc, char** argv) {
    std::cout << "hello from C++ inside codebox (" << argc - 1 << " arguments)\n";
}
